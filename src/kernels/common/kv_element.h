// The paged KV cache's element type, as every kernel that reads or writes the cache takes it:
// bf16, or e4m3 (FP8) holding value / scale, one scale per KV head for keys and one for values
// (models/kv_cache_format.h states the rule that picks them). The device side of each type is
// attention/kv_element.cuh.
#pragma once

namespace asynct::kernels {

enum class KvElement { Bf16, Fp8E4M3 };

}  // namespace asynct::kernels
