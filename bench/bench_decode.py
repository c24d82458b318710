"""Decode attention: asynct (async and softmax gates) against PyTorch SDPA (cuDNN and flash
backends, contiguous KV) and the copy ceiling. Hq=16, Hkv=8, D=128, bf16, standard-normal
Q/K/V, alpha=sigma=gamma=1, W=3. Effective bandwidth = dense K+V bytes / time.
Beside it, the same kernel over the same K/V as an FP8 (e4m3) cache: per KV head, scale = the
head's largest |value| / 448, the cache holding value / scale; its rate is taken in its own
bytes (half of bf16's), its output compared with the bf16 cache's.

Usage: python3 bench/bench_decode.py --lib BUILD_DIR --out OUT_DIR [--block-size 16] [--shapes 32x4096]
       [--profile]
--profile launches each shape's four kernels (async and softmax gates over the bf16 and the e4m3
cache) twice, in that order, and nothing else: the launches to give a profiler, e.g.
  ncu -k regex:decode_stage1 --launch-skip 4 python3 bench/bench_decode.py ... --shapes 32x4096 --profile
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import shape_list, ceilings, median_ms, parse_args, rel_err, write_json

SHAPES = [(1, 131072), (4, 32768), (32, 1024), (32, 4096), (32, 16384)]
HQ, HKV, D = 16, 8, 128


def sdpa_time(q, k, v, backend):
    """SDPA on contiguous [B, H, L, D] tensors; None if the backend refuses the shape."""
    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    try:
        out = run()
    except RuntimeError:
        return None, None
    return median_ms(run), out


def decode_inputs(seqs, ctx, block_size, device="cuda"):
    """The bench's inputs for one shape: query [seqs, HQ, D], a paged K/V cache whose blocks lie
    in random order, the block table and kv_lens; all standard normal / int32."""
    blocks_per_seq = (ctx + block_size - 1) // block_size
    nb = seqs * blocks_per_seq
    key_cache = torch.randn(nb, block_size, HKV, D, device=device, dtype=torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    table = torch.randperm(nb, device=device, dtype=torch.int32).view(seqs, blocks_per_seq)
    q = torch.randn(seqs, HQ, D, device=device, dtype=torch.bfloat16)
    kv_lens = torch.full((seqs,), ctx, device=device, dtype=torch.int32)
    return q, key_cache, value_cache, table, kv_lens


def fp8_cache(key_cache, value_cache):
    """The e4m3 cache of the same K/V: per KV head, scale = the head's largest |value| / 448, the
    cache holding value / scale. {"key": (cache, scales), "value": (cache, scales)}."""
    out = {}
    for name, cache in (("key", key_cache), ("value", value_cache)):
        scales = (cache.float().abs().amax(dim=(0, 1, 3)) / 448.0).clamp_min(1e-12)
        out[name] = ((cache.float() / scales.view(1, 1, HKV, 1)).to(torch.float8_e4m3fn), scales.contiguous())
    return out


def add_options(parser):
    parser.add_argument("--shapes", type=shape_list("bench_decode"), default=SHAPES,
                        help="sequences x context, e.g. 32x4096,1x131072")
    parser.add_argument("--profile", action="store_true", help="only the launches, for a profiler (see above)")


def profile(asynct, shapes, block_size):
    """Each shape's four kernels launched twice, round by round (the first round warms up)."""
    for seqs, ctx in shapes:
        q, key_cache, value_cache, table, kv_lens = decode_inputs(seqs, ctx, block_size)
        fp8 = fp8_cache(key_cache, value_cache)
        gates = (asynct.Gate.async_(HQ), asynct.Gate.softmax())
        for first in (True, False):
            for gate in gates:
                asynct.decode(q, key_cache, value_cache, table, kv_lens, gate, max_kv_len=ctx, check=first)
            for gate in gates:
                asynct.decode(q, fp8["key"][0], fp8["value"][0], table, kv_lens, gate, max_kv_len=ctx,
                              check=first, key_scales=fp8["key"][1], value_scales=fp8["value"][1])
        torch.cuda.synchronize()
        print(f"bench_decode --profile: {seqs} x {ctx}, async and softmax over bf16 then e4m3, two rounds")


def main():
    args = parse_args(__doc__, block_size=True, extra=add_options)
    import asynct
    if args.profile:
        return profile(asynct, args.shapes, args.block_size)

    copy_tb_s = ceilings(args.out)["copy_tb_per_s"]
    torch.manual_seed(0)
    rows = []
    for seqs, ctx in args.shapes:
        bs = args.block_size
        blocks_per_seq = (ctx + bs - 1) // bs
        q, key_cache, value_cache, table, kv_lens = decode_inputs(seqs, ctx, bs)
        kv_bytes = 2 * seqs * ctx * HKV * D * 2

        counters = torch.zeros(2, device="cuda", dtype=torch.int64)
        gates = {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}
        times, outs = {}, {}
        for name, gate in gates.items():
            # The batch is checked once; the timed calls skip the check (a host round trip).
            fn = lambda check=False: asynct.decode(q, key_cache, value_cache, table, kv_lens, gate, max_kv_len=ctx,
                                                   check=check)
            outs[name] = fn(check=True)
            times[name] = median_ms(fn)
        asynct.decode(q, key_cache, value_cache, table, kv_lens, gates["async"], max_kv_len=ctx,
                      counters=counters)
        nonzero = counters[0].item() / (seqs * HQ * ctx)
        v_rows = counters[1].item() / (seqs * HKV * ctx)

        fp8 = fp8_cache(key_cache, value_cache)
        fp8_times, fp8_errs = {}, {}
        for name, gate in gates.items():
            fn8 = lambda check=False: asynct.decode(q, fp8["key"][0], fp8["value"][0], table, kv_lens, gate,
                                                    max_kv_len=ctx, check=check, key_scales=fp8["key"][1],
                                                    value_scales=fp8["value"][1])
            fp8_errs[name] = rel_err(fn8(check=True), outs[name])
            fp8_times[name] = median_ms(fn8)
        del fp8

        # The same K/V, contiguous, for SDPA: [B, Hkv, L, D].
        k = key_cache[table.long()].reshape(seqs, blocks_per_seq * bs, HKV, D)[:, :ctx].transpose(1, 2).contiguous()
        v = value_cache[table.long()].reshape(seqs, blocks_per_seq * bs, HKV, D)[:, :ctx].transpose(1, 2).contiguous()
        q4 = q.view(seqs, HQ, 1, D)
        cudnn_ms, cudnn_out = sdpa_time(q4, k, v, SDPBackend.CUDNN_ATTENTION)
        flash_ms, flash_out = sdpa_time(q4, k, v, SDPBackend.FLASH_ATTENTION)
        ref = cudnn_out if cudnn_out is not None else flash_out
        err = rel_err(outs["softmax"], ref.view(seqs, HQ, D)) if ref is not None else float("nan")
        del k, v, key_cache, value_cache
        torch.cuda.empty_cache()

        gbs = lambda ms: kv_bytes / (ms * 1e-3) / 1e9 if ms else None
        best_sdpa = min(t for t in (cudnn_ms, flash_ms) if t is not None)
        rows.append({
            "seqs": seqs, "ctx": ctx, "block_size": bs, "kv_gb": kv_bytes / 1e9,
            "async_ms": times["async"], "softmax_ms": times["softmax"],
            "cudnn_ms": cudnn_ms, "flash_ms": flash_ms,
            "async_gb_s": gbs(times["async"]), "softmax_gb_s": gbs(times["softmax"]),
            "softmax_of_ceiling": gbs(times["softmax"]) / (copy_tb_s * 1e3),
            "async_speedup_over_softmax": times["softmax"] / times["async"],
            "softmax_vs_best_sdpa": best_sdpa / times["softmax"],
            "p_nonzero_fraction": nonzero, "v_rows_loaded_fraction": v_rows,
            "softmax_rel_err_vs_sdpa": err,
            "fp8_async_ms": fp8_times["async"], "fp8_softmax_ms": fp8_times["softmax"],
            "fp8_softmax_of_ceiling": kv_bytes / 2 / (fp8_times["softmax"] * 1e-3) / 1e9 / (copy_tb_s * 1e3),
            "fp8_async_of_ceiling": kv_bytes / 2 / (fp8_times["async"] * 1e-3) / 1e9 / (copy_tb_s * 1e3),
            "fp8_over_bf16_softmax": fp8_times["softmax"] / times["softmax"],
            "fp8_over_bf16_async": fp8_times["async"] / times["async"],
            "fp8_rel_err_vs_bf16_cache": max(fp8_errs.values()),
        })
    write_json(args.out, f"decode_bs{args.block_size}.json", {"copy_tb_per_s": copy_tb_s, "rows": rows})

    print(f"\ndecode, Hq={HQ} Hkv={HKV} D={D} bf16, block_size {args.block_size}, "
          f"copy ceiling {copy_tb_s:.2f} TB/s")
    print(f"{'seqs x ctx':>12} {'KV GB':>6} {'async ms':>9} {'soft ms':>8} {'cudnn ms':>9} "
          f"{'flash ms':>9} {'soft/ceil':>9} {'async/soft':>10} {'soft vs sdpa':>12} {'P!=0':>5} {'Vrows':>5} {'err':>8}")
    fmt = lambda x: f"{x:9.3f}" if x is not None else f"{'-':>9}"
    for r in rows:
        print(f"{r['seqs']:>4} x {r['ctx']:<6} {r['kv_gb']:6.2f} {r['async_ms']:9.3f} {r['softmax_ms']:8.3f} "
              f"{fmt(r['cudnn_ms'])} {fmt(r['flash_ms'])} {r['softmax_of_ceiling']:9.2f} "
              f"{r['async_speedup_over_softmax']:10.2f} {r['softmax_vs_best_sdpa']:12.2f} "
              f"{r['p_nonzero_fraction']:5.2f} {r['v_rows_loaded_fraction']:5.2f} {r['softmax_rel_err_vs_sdpa']:8.1e}")
    print(f"\nthe same over an FP8 (e4m3) cache; 'of ceil' in its own bytes (half of bf16's)")
    print(f"{'seqs x ctx':>12} {'async ms':>9} {'soft ms':>8} {'async/ceil':>10} {'soft/ceil':>9} "
          f"{'async/bf16':>10} {'soft/bf16':>9} {'err':>8}")
    for r in rows:
        print(f"{r['seqs']:>4} x {r['ctx']:<6} {r['fp8_async_ms']:9.3f} {r['fp8_softmax_ms']:8.3f} "
              f"{r['fp8_async_of_ceiling']:10.2f} {r['fp8_softmax_of_ceiling']:9.2f} {r['fp8_over_bf16_async']:10.2f} "
              f"{r['fp8_over_bf16_softmax']:9.2f} {r['fp8_rel_err_vs_bf16_cache']:8.1e}")


if __name__ == "__main__":
    main()
