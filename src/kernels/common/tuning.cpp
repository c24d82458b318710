#include "kernels/common/tuning.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace asynct::kernels {
namespace {

KernelTuning g_tuning;

// A whole decimal integer in [lo, hi], or an error naming the variable.
int parse_int(const char* name, const char* value, int lo, int hi, const char* forms) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value, &end, 10);
  check(end != value && *end == '\0' && errno == 0 && v >= lo && v <= hi, name, "='", value, "': expected ", forms);
  return int(v);
}

}  // namespace

const KernelTuning& kernel_tuning() { return g_tuning; }

void set_kernel_tuning(const KernelTuning& tuning) { g_tuning = tuning; }

const std::vector<std::string>& kernel_tuning_names() {
  static const std::vector<std::string> names = {"ASYNCT_GEMM",          "ASYNCT_PREFILL",      "ASYNCT_PREFILL_SPLITS",
                                                 "ASYNCT_PREFILL_GROUP", "ASYNCT_PREFILL_CTAS", "ASYNCT_SKINNY_TILE",   "ASYNCT_SKINNY_SPLITS", "ASYNCT_SKINNY_WGMMA",
                                                 "ASYNCT_PDL", "ASYNCT_GRAPH_PREFILL"};
  return names;
}

GemmPath gemm_path_from_name(const char* name) {
  const std::string n = name;
  if (n == "cublaslt") return GemmPath::CublasLt;
  if (n == "tuned") return GemmPath::CublasLtTuned;
  if (n == "skinny") return GemmPath::Skinny;
  throw Error(detail::concat("unknown GEMM path '", n, "': expected cublaslt, tuned or skinny"));
}

KernelTuning parse_kernel_tuning(const std::function<const char*(const char* name)>& lookup,
                                 const KernelTuning& base) {
  KernelTuning t = base;
  const auto value_of = [&](const char* name) -> const char* {
    const char* v = lookup(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = value_of("ASYNCT_GEMM")) {
    const std::string s = v;
    check(s == "cublaslt" || s == "tuned" || s == "skinny", "ASYNCT_GEMM='", s, "': expected cublaslt, tuned or skinny");
    t.gemm = gemm_path_from_name(v);
  }
  if (const char* v = value_of("ASYNCT_PREFILL")) {
    const std::string s = v;
    check(s == "portable" || s == "hopper", "ASYNCT_PREFILL='", s, "': expected portable or hopper");
    t.prefill = s == "portable" ? PrefillKernel::kPortable : PrefillKernel::kHopper;
  }
  if (const char* v = value_of("ASYNCT_PREFILL_SPLITS"))
    t.prefill_kv_splits = parse_int("ASYNCT_PREFILL_SPLITS", v, 0, 16, "a split count of 1..16 (0: automatic)");
  if (const char* v = value_of("ASYNCT_PREFILL_GROUP"))
    t.prefill_seq_group = parse_int("ASYNCT_PREFILL_GROUP", v, 0, INT_MAX, "a sequence count (0: automatic)");
  if (const char* v = value_of("ASYNCT_PREFILL_CTAS"))
    t.prefill_ctas = parse_int("ASYNCT_PREFILL_CTAS", v, 0, INT_MAX, "a CTA count (0: one CTA a tile)");
  if (const char* v = value_of("ASYNCT_SKINNY_TILE"))
    t.skinny.tile_n = parse_int("ASYNCT_SKINNY_TILE", v, 0, INT_MAX, "a column tile width (64 or 128; 0: automatic)");
  if (const char* v = value_of("ASYNCT_SKINNY_SPLITS"))
    t.skinny.splits = parse_int("ASYNCT_SKINNY_SPLITS", v, 0, INT_MAX, "a split count (0: automatic)");
  if (const char* v = value_of("ASYNCT_SKINNY_WGMMA"))
    t.skinny.wgmma = parse_int("ASYNCT_SKINNY_WGMMA", v, 0, 1, "0 (mma.sync) or 1 (wgmma)") != 0
                         ? KernelTuning::Skinny::kOn
                         : KernelTuning::Skinny::kOff;
  if (const char* v = value_of("ASYNCT_PDL"))
    t.dependent_launch = parse_int("ASYNCT_PDL", v, 0, 1, "0 (off) or 1 (on)") != 0;
  if (const char* v = value_of("ASYNCT_GRAPH_PREFILL"))
    t.graph_prefill_len = parse_int("ASYNCT_GRAPH_PREFILL", v, 0, 4096, "a token count of 0..4096 (0: the default)");
  return t;
}

}  // namespace asynct::kernels
