"""asynct's CUDA kernels on PyTorch CUDA tensors, through the C ABI (libasynct.so, ctypes).

The library is found through $ASYNCT_LIB, else under build/*/lib/ of this checkout. Tensors are
bf16 unless stated; shapes and layouts are those of the headers under src/kernels/. Errors in the kernels'
argument checks come back as asynct.KernelError with the library's message.
"""
import ctypes
import glob
import math
import os

import torch

__all__ = ["KernelError", "Gate", "decode", "decode_num_splits", "prefill", "norm",
           "fused_add_norm", "post_attn_pre_mlp", "linear", "set_tuning", "library"]


class KernelError(RuntimeError):
    pass


class _PagedKv(ctypes.Structure):
    _fields_ = [("key_cache", ctypes.c_void_p), ("value_cache", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("max_blocks_per_seq", ctypes.c_int),
                ("num_blocks", ctypes.c_int), ("block_size", ctypes.c_int),
                ("num_kv_heads", ctypes.c_int), ("head_dim", ctypes.c_int), ("element", ctypes.c_int),
                ("key_scales", ctypes.c_void_p), ("value_scales", ctypes.c_void_p)]


class _Gate(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("pool_window", ctypes.c_int), ("alpha", ctypes.c_void_p),
                ("sigma", ctypes.c_void_p), ("gamma", ctypes.c_void_p), ("softcap", ctypes.c_float)]


_lib = None


def library():
    """The loaded libasynct.so (loaded on first use)."""
    global _lib
    if _lib is None:
        path = os.environ.get("ASYNCT_LIB")
        if not path:
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            found = sorted(glob.glob(os.path.join(root, "build", "*", "lib", "libasynct.so")),
                           key=os.path.getmtime)
            if not found:
                raise KernelError("libasynct.so not found: build with CUDA (scripts/test.sh or "
                                  "scripts/gpu_check.sh) or set ASYNCT_LIB")
            path = found[-1]
        _lib = ctypes.CDLL(path)
        _lib.asynct_last_error.restype = ctypes.c_char_p
        _lib.asynct_decode_workspace_bytes.restype = ctypes.c_size_t
    return _lib


def _call(name, *args):
    if getattr(library(), name)(*args) != 0:
        raise KernelError(f"{name}: {library().asynct_last_error().decode()}")


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def _stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _expect(t, dtype, ndim, what):
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise KernelError(f"{what}: expected a CUDA tensor")
    if t.dtype != dtype or t.dim() != ndim or not t.is_contiguous():
        raise KernelError(f"{what}: expected a contiguous {dtype} tensor of {ndim} dims, "
                          f"got {t.dtype} {tuple(t.shape)}")


class Gate:
    """The attention gate: Gate.async_(alpha, sigma, gamma, window) or Gate.softmax(softcap)."""

    def __init__(self, kind, window=3, alpha=None, sigma=None, gamma=None, softcap=0.0):
        self.kind, self.window, self.softcap = kind, window, softcap
        self.alpha, self.sigma, self.gamma = alpha, sigma, gamma

    @staticmethod
    def async_(num_q_heads, alpha=1.0, sigma=1.0, gamma=1.0, window=3, device="cuda"):
        as_param = lambda v: (v if isinstance(v, torch.Tensor) else
                              torch.full((num_q_heads,), float(v))).to(device, torch.float32).contiguous()
        return Gate("async", window, as_param(alpha), as_param(sigma), as_param(gamma))

    @staticmethod
    def softmax(softcap=0.0):
        return Gate("softmax", softcap=softcap)

    def _c(self):
        return _Gate(0 if self.kind == "async" else 1, self.window, _ptr(self.alpha).value,
                     _ptr(self.sigma).value, _ptr(self.gamma).value, self.softcap)


def _paged(key_cache, value_cache, block_table, key_scales=None, value_scales=None):
    """The paged cache for the C ABI: bf16, or e4m3 (torch.float8_e4m3fn, holding value / scale)
    with float32 scales [num_kv_heads] for keys and values."""
    fp8 = getattr(key_cache, "dtype", None) == torch.float8_e4m3fn
    _expect(key_cache, torch.float8_e4m3fn if fp8 else torch.bfloat16, 4, "key_cache")
    _expect(value_cache, key_cache.dtype, 4, "value_cache")
    _expect(block_table, torch.int32, 2, "block_table")
    if key_cache.shape != value_cache.shape:
        raise KernelError("key_cache and value_cache differ in shape")
    nb, bs, hkv, d = key_cache.shape
    if fp8:
        for name, scales in (("key_scales", key_scales), ("value_scales", value_scales)):
            if scales is None:
                raise KernelError(f"an e4m3 cache needs {name}")
            _expect(scales, torch.float32, 1, name)
            if scales.shape[0] != hkv:
                raise KernelError(f"{name} has {scales.shape[0]} entries for {hkv} KV heads")
    return _PagedKv(key_cache.data_ptr(), value_cache.data_ptr(), block_table.data_ptr(),
                    block_table.shape[1], nb, bs, hkv, d, 1 if fp8 else 0,
                    key_scales.data_ptr() if fp8 else None, value_scales.data_ptr() if fp8 else None)


def decode_num_splits(num_seqs, num_kv_heads, max_kv_len):
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return library().asynct_decode_num_splits(num_seqs, num_kv_heads, max_kv_len, sms)


def _expect_rows(block_table, kv_lens, seqs):
    if kv_lens.shape[0] != seqs or block_table.shape[0] < seqs:
        raise KernelError(f"{seqs} sequences, but kv_lens has {kv_lens.shape[0]} entries and the block "
                          f"table {block_table.shape[0]} rows")


def _check_batch(kv, kv_lens, max_kv_len, cu_seqlens_q=None, total_q=0, max_q_len=0):
    """The batch's block table and lengths against the cache (the kernels trust them)."""
    _call("asynct_check_paged_batch", kv, _ptr(kv_lens), kv_lens.shape[0], int(max_kv_len),
          _ptr(cu_seqlens_q), int(total_q), int(max_q_len), _stream())


def decode(query, key_cache, value_cache, block_table, kv_lens, gate, max_kv_len=None, scale=0.0,
           num_splits=0, out=None, counters=None, workspace=None, check=True, key_scales=None, value_scales=None):
    """Decode attention: query [seqs, Hq, D] against the paged cache; returns out [seqs, Hq, D].

    kv_lens: int32 [seqs]. counters: optional int64 [2] CUDA tensor, added to: non-zero P
    entries, V rows loaded. check: first copy kv_lens and the block table to the host and check
    them against the cache (a synchronisation; benchmarks turn it off). An e4m3 cache
    (torch.float8_e4m3fn, value / scale) takes key_scales and value_scales, float32 [Hkv].
    """
    _expect(query, torch.bfloat16, 3, "query")
    _expect(kv_lens, torch.int32, 1, "kv_lens")
    seqs, hq, d = query.shape
    kv = _paged(key_cache, value_cache, block_table, key_scales, value_scales)
    _expect_rows(block_table, kv_lens, seqs)
    if max_kv_len is None:
        max_kv_len = int(kv_lens.max())
    if check:
        _check_batch(kv, kv_lens, max_kv_len)
    splits = num_splits or decode_num_splits(seqs, kv.num_kv_heads, max_kv_len)
    if workspace is None:
        nbytes = library().asynct_decode_workspace_bytes(seqs, hq, d, splits)
        workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=query.device)
    out = torch.empty_like(query) if out is None else out
    _call("asynct_decode", _ptr(query), _ptr(out), _ptr(kv_lens), seqs, hq, int(max_kv_len),
          ctypes.c_float(scale), kv, gate._c(), splits, _ptr(workspace), _ptr(counters), _stream())
    return out


def prefill(query, key, value, key_cache, value_cache, block_table, cu_seqlens_q, kv_lens, gate,
            max_q_len, max_kv_len, scale=0.0, out=None, check=True, key_scales=None, value_scales=None):
    """Prefill attention over new tokens (query/key/value [total_q, H, D]) after cached prefixes;
    writes the new K/V into the cache. Returns out [total_q, Hq, D]. check: as for decode, with
    cu_seqlens_q too. An e4m3 cache takes key_scales and value_scales, as for decode."""
    _expect(query, torch.bfloat16, 3, "query")
    _expect(key, torch.bfloat16, 3, "key")
    _expect(value, torch.bfloat16, 3, "value")
    _expect(cu_seqlens_q, torch.int32, 1, "cu_seqlens_q")
    _expect(kv_lens, torch.int32, 1, "kv_lens")
    kv = _paged(key_cache, value_cache, block_table, key_scales, value_scales)
    _expect_rows(block_table, kv_lens, kv_lens.shape[0])
    if cu_seqlens_q.shape[0] != kv_lens.shape[0] + 1:
        raise KernelError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries for {kv_lens.shape[0]} sequences")
    if check:
        _check_batch(kv, kv_lens, max_kv_len, cu_seqlens_q, query.shape[0], max_q_len)
    out = torch.empty_like(query) if out is None else out
    _call("asynct_prefill", _ptr(query), _ptr(key), _ptr(value), _ptr(out), _ptr(cu_seqlens_q),
          _ptr(kv_lens), kv_lens.shape[0], query.shape[0], int(max_q_len), int(max_kv_len),
          query.shape[1], ctypes.c_float(scale), kv, gate._c(), _stream())
    return out


def _norm_args(eps, clip):
    return ctypes.c_float(eps), ctypes.c_float(math.inf if clip is None else clip)


def norm(x, weight, eps=1e-6, clip=None, out=None):
    """UClipNorm (clip given) or RMSNorm (clip None) over the last dim of a 2-D x."""
    _expect(x, torch.bfloat16, 2, "x")
    out = torch.empty_like(x) if out is None else out
    _call("asynct_norm", _ptr(x), _ptr(weight), _ptr(out), x.shape[0], x.shape[1],
          *_norm_args(eps, clip), _stream())
    return out


def fused_add_norm(x, residual, weight, eps=1e-6, clip=None, out=None):
    """residual += x (in place); returns norm(residual)."""
    _expect(x, torch.bfloat16, 2, "x")
    _expect(residual, torch.bfloat16, 2, "residual")
    out = torch.empty_like(x) if out is None else out
    _call("asynct_fused_add_norm", _ptr(x), _ptr(residual), _ptr(weight), _ptr(out), x.shape[0],
          x.shape[1], *_norm_args(eps, clip), _stream())
    return out


def post_attn_pre_mlp(attn_out, residual, out_weight, next_weight, eps=1e-6, clip=None, out=None):
    """residual += norm(attn_out, out_weight) (in place); returns norm(residual, next_weight)."""
    _expect(attn_out, torch.bfloat16, 2, "attn_out")
    _expect(residual, torch.bfloat16, 2, "residual")
    out = torch.empty_like(attn_out) if out is None else out
    _call("asynct_post_attn_pre_mlp", _ptr(attn_out), _ptr(residual), _ptr(out_weight),
          _ptr(next_weight), _ptr(out), attn_out.shape[0], attn_out.shape[1],
          *_norm_args(eps, clip), _stream())
    return out


_GEMM_PATHS = {"default": 0, "cublaslt": 1, "tuned": 2, "skinny": 3}


def linear(x, weight, out=None, out_fp32=False, path="default"):
    """x [rows, in] @ weight[out, in]^T (nn.Linear without bias), bf16 or fp32 (out_fp32) out.

    path: "default" (the engine's), "cublaslt", "tuned" (cuBLASLt's fastest candidate, timed on
    the first call of a shape) or "skinny" (the split-K kernel for up to 64 rows).
    """
    _expect(x, torch.bfloat16, 2, "x")
    _expect(weight, torch.bfloat16, 2, "weight")
    if x.shape[1] != weight.shape[1]:
        raise KernelError(f"linear: x has {x.shape[1]} features, weight expects {weight.shape[1]}")
    if path not in _GEMM_PATHS:
        raise KernelError(f"linear: unknown path {path!r}, expected one of {sorted(_GEMM_PATHS)}")
    rows, n = x.shape[0], weight.shape[0]
    if out is None:
        out = torch.empty(rows, n, device=x.device, dtype=torch.float32 if out_fp32 else torch.bfloat16)
    _call("asynct_linear", _ptr(x), _ptr(weight), _ptr(out), rows, x.shape[1], n, int(out_fp32),
          _GEMM_PATHS[path], _stream())
    return out


# set_tuning's keywords and the overrides (src/kernels/common/tuning.h) they set.
_TUNING = {"gemm": "ASYNCT_GEMM", "prefill": "ASYNCT_PREFILL", "prefill_splits": "ASYNCT_PREFILL_SPLITS",
           "prefill_group": "ASYNCT_PREFILL_GROUP",
           "prefill_ctas": "ASYNCT_PREFILL_CTAS", "skinny_tile": "ASYNCT_SKINNY_TILE",
           "skinny_splits": "ASYNCT_SKINNY_SPLITS", "skinny_wgmma": "ASYNCT_SKINNY_WGMMA",
           "pdl": "ASYNCT_PDL", "graph_prefill": "ASYNCT_GRAPH_PREFILL"}


def set_tuning(**overrides):
    """Overrides the kernels' own choices for every later call in this process (the library's
    KernelTuning, src/kernels/common/tuning.h); the overrides not named are kept.

    Keywords (or their ASYNCT_* names): gemm = "cublaslt" | "tuned" | "skinny" (the default path
    of linear); prefill = "portable" | "hopper"; prefill_splits = 1..16 (CTAs sharing a query
    tile's keys in the Hopper prefill kernel); prefill_group = N (sequences whose tiles the
    prefill kernels take before the next ones'); prefill_ctas = N (at most N
    persistent Hopper prefill CTAs taking tiles in turn; 0: one CTA a tile); skinny_tile = 64 | 128; skinny_splits = N;
    skinny_wgmma = True | False; pdl = True | False (dependent launches); graph_prefill = N (the
    engine's CUDA runner: the most new tokens a sequence of a step replayed from a graph). None restores a
    default. Example: asynct.set_tuning(prefill="portable").
    """
    names = set(_TUNING.values())
    for key, value in overrides.items():
        name = _TUNING.get(key, key)
        if name not in names:
            raise KernelError(f"set_tuning: unknown override {key!r}, expected one of {sorted(_TUNING)}")
        if isinstance(value, bool):
            value = "1" if value else "0"
        _call("asynct_set_tuning", name.encode(), None if value is None else str(value).encode())
