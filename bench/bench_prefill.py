"""Prefill attention TFLOP/s (causal counts half): asynct's prefill (async and softmax gates,
pure prefill writing the paged cache) against cuDNN SDPA (and flash), Hq=16, Hkv=8, D=128,
bf16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3. The kernel is the one launch_prefill
picks (on Hopper the wgmma kernel); --kernel portable measures the portable one
(asynct.set_tuning(prefill=...)).

Beside the equal-length batches, two cases the engine meets: a varlen batch (16 prompts of
100..4096 tokens, seeded), against FlashAttention-2 through SDPA on a jagged nested tensor and
cuDNN SDPA per sequence; and a prefix case (4 sequences of 1024 new tokens after 4096 cached in
the paged cache), against SDPA with the causal mask aligned to the last key (causal_lower_right).
An anchor that PyTorch cannot run here is reported as missing.

Usage: python3 bench/bench_prefill.py --lib BUILD_DIR --out OUT_DIR [--block-size 16]
       [--kernel auto|portable|hopper] [--shapes 16x1024,1x16384] [--profile]
--profile runs each shape's two gates twice and nothing else (no timing, no anchors, no
varlen or prefix case): the launches to give a profiler, e.g.
  ncu --clock-control none -k regex:prefill_hopper --launch-skip 1 python3 bench/bench_prefill.py ... --profile
"""
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from common import shape_list, ceilings, median_ms, parse_args, rel_err, write_json

SHAPES = [(16, 1024), (8, 2048), (4, 4096), (2, 8192), (1, 16384)]
HQ, HKV, D = 16, 8, 128


def sdpa(q, k, v, backend, causal):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def prefill_inputs(batch, length, block_size):
    """Standard-normal Q/K/V for `batch` sequences of `length` new tokens, an empty paged cache
    of `block_size` with a shuffled block table, and the length arrays."""
    total = batch * length
    q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    blocks_per_seq = (length + block_size - 1) // block_size
    key_cache = torch.empty(batch * blocks_per_seq, block_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.empty_like(key_cache)
    table = torch.randperm(batch * blocks_per_seq, device="cuda", dtype=torch.int32).view(batch, -1)
    cu = torch.arange(0, total + 1, length, device="cuda", dtype=torch.int32)
    kv_lens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    return q, k, v, key_cache, value_cache, table, cu, kv_lens


def time_ours(asynct, q, k, v, key_cache, value_cache, table, cu, kv_lens, max_q_len, max_kv_len, **scales):
    """{gate: (ms, output)} for both gates (the batch checked once; the timed calls skip it).
    scales: key_scales and value_scales of an e4m3 cache."""
    result = {}
    for name, gate in {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}.items():
        fn = lambda check=False: asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gate,
                                                max_q_len=max_q_len, max_kv_len=max_kv_len, check=check, **scales)
        out = fn(check=True)
        result[name] = (median_ms(fn, warmup=3, reps=10), out)
    return result


def try_anchor(row, key, flops, fn):
    """Times an anchor into row[key + "_tflops"] (None where PyTorch cannot run it); its output."""
    try:
        out = fn()
        ms = median_ms(fn, warmup=3, reps=10)
    except Exception as e:  # noqa: BLE001 (an unsupported backend, shape or layout)
        row[key + "_tflops"] = None
        row[key + "_missing"] = f"{type(e).__name__}: {str(e)[:120]}"
        return None
    row[key + "_tflops"] = flops / (ms * 1e-3) / 1e12
    return out


def varlen_case(asynct, block_size, seed=1):
    """16 prompts of 100..4096 new tokens in one batch, no prefix."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(100, 4097, (16,), generator=gen).tolist()
    total = sum(lengths)
    q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    blocks = [(n + block_size - 1) // block_size for n in lengths]
    key_cache = torch.empty(sum(blocks), block_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.empty_like(key_cache)
    order = torch.randperm(sum(blocks), device="cuda", dtype=torch.int32)
    table = torch.zeros(len(lengths), max(blocks), device="cuda", dtype=torch.int32)
    at = 0
    for i, b in enumerate(blocks):
        table[i, :b] = order[at:at + b]
        at += b
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), device="cuda", dtype=torch.int32)
    kv_lens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    flops = sum(4 * HQ * n * n * D / 2 for n in lengths)
    row = {"case": "varlen", "lengths": lengths, "tokens": total}
    ours = time_ours(asynct, q, k, v, key_cache, value_cache, table, cu, kv_lens, max(lengths), max(lengths))
    for name, (ms, _) in ours.items():
        row[name + "_tflops"] = flops / (ms * 1e-3) / 1e12
    starts = [int(x) for x in cu.tolist()[:-1]]
    pieces = [(q[a:a + n].transpose(0, 1), k[a:a + n].transpose(0, 1), v[a:a + n].transpose(0, 1))
              for a, n in zip(starts, lengths)]

    def jagged(index, repeat=1):  # (B, H, j, D); K and V repeated per query head: the jagged path takes no GQA
        return torch.nested.nested_tensor([x[index].repeat_interleave(repeat, 0).transpose(0, 1) for x in pieces],
                                          layout=torch.jagged).transpose(1, 2)

    built = {}  # the nested tensors, made by the first (untimed) call

    def flash_jagged():
        if not built:
            built.update(q=jagged(0), k=jagged(1, HQ // HKV), v=jagged(2, HQ // HKV))
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(built["q"], built["k"], built["v"], is_causal=True)

    def cudnn_each():
        return [sdpa(x[0][None], x[1][None], x[2][None], SDPBackend.CUDNN_ATTENTION, True) for x in pieces]

    try_anchor(row, "flash_jagged", flops, flash_jagged)
    outs = try_anchor(row, "cudnn_each", flops, cudnn_each)
    if outs is not None:
        reference = torch.cat([o[0].transpose(0, 1) for o in outs])
        row["softmax_rel_err_vs_cudnn"] = rel_err(ours["softmax"][1], reference)
    return row


def to_e4m3(cache):
    """An e4m3 form of a bf16 cache [blocks, block_size, Hkv, D] and its scales [Hkv] (each KV
    head's largest |value| at 224, as the kernel tests take them)."""
    scales = (cache.float().abs().amax(dim=(0, 1, 3)) / 224).contiguous()
    return (cache.float() / scales[None, None, :, None]).to(torch.float8_e4m3fn), scales


def prefix_case(asynct, block_size, batch=4, cached=4096, new=1024):
    """`batch` sequences of `new` tokens after `cached` tokens already in the paged cache; ours
    over a bf16 cache and over its e4m3 form."""
    context = cached + new
    q = torch.randn(batch * new, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch * new, HKV, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch * new, HKV, D, device="cuda", dtype=torch.bfloat16)
    blocks_per_seq = (context + block_size - 1) // block_size
    key_cache = torch.randn(batch * blocks_per_seq, block_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    table = torch.randperm(batch * blocks_per_seq, device="cuda", dtype=torch.int32).view(batch, -1)
    cu = torch.arange(0, batch * new + 1, new, device="cuda", dtype=torch.int32)
    kv_lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    flops = batch * 4 * HQ * D * (new * cached + new * new / 2)
    row = {"case": "prefix", "batch": batch, "cached": cached, "new": new}
    ours = time_ours(asynct, q, k, v, key_cache, value_cache, table, cu, kv_lens, new, context)
    for name, (ms, _) in ours.items():
        row[name + "_tflops"] = flops / (ms * 1e-3) / 1e12
    (key_e4m3, key_scales), (value_e4m3, value_scales) = to_e4m3(key_cache), to_e4m3(value_cache)
    fp8 = time_ours(asynct, q, k, v, key_e4m3, value_e4m3, table, cu, kv_lens, new, context,
                    key_scales=key_scales, value_scales=value_scales)
    for name, (ms, out) in fp8.items():
        row[name + "_fp8_cache_tflops"] = flops / (ms * 1e-3) / 1e12
        row[name + "_fp8_cache_rel_err_vs_bf16"] = rel_err(out, ours[name][1])
    del key_e4m3, value_e4m3
    # The same keys contiguous for SDPA: the cached ones gathered through the block table, then the new ones.
    def contiguous(cache, fresh):
        rows = cache[table.long()].reshape(batch, blocks_per_seq * block_size, HKV, D)[:, :cached]
        return torch.cat([rows, fresh.view(batch, new, HKV, D)], 1).transpose(1, 2)
    # K and V repeated per query head: the lower-right causal mask's path may not take GQA.
    q4 = q.view(batch, new, HQ, D).transpose(1, 2)
    k4 = contiguous(key_cache, k).repeat_interleave(HQ // HKV, 1)
    v4 = contiguous(value_cache, v).repeat_interleave(HQ // HKV, 1)
    mask = causal_lower_right(new, context)
    for backend, label in [(SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash"),
                           (SDPBackend.EFFICIENT_ATTENTION, "efficient")]:
        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask)
        out = try_anchor(row, label, flops, run)
        if out is not None and "softmax_rel_err_vs_anchor" not in row:
            row["softmax_rel_err_vs_anchor"] = rel_err(ours["softmax"][1], out.transpose(1, 2).reshape(batch * new, HQ, D))
    return row


def add_options(parser):
    parser.add_argument("--kernel", choices=["auto", "portable", "hopper"], default="auto", help="which prefill kernel runs")
    parser.add_argument("--shapes", type=shape_list("bench_prefill"), default=SHAPES, help="equal-length batches, e.g. 16x1024,1x16384")
    parser.add_argument("--profile", action="store_true", help="only the launches, for a profiler (see above)")


def profile(asynct, shapes, block_size):
    """Each shape's gates launched twice (the first warms up), synchronised, nothing timed."""
    for batch, length in shapes:
        q, k, v, key_cache, value_cache, table, cu, kv_lens = prefill_inputs(batch, length, block_size)
        for gate in (asynct.Gate.async_(HQ), asynct.Gate.softmax()):
            for _ in range(2):
                asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gate, max_q_len=length,
                               max_kv_len=length, check=False)
        torch.cuda.synchronize()
        print(f"bench_prefill --profile: {batch} x {length}, both gates, two launches each")


def main():
    args = parse_args(__doc__, block_size=True, extra=add_options)
    import asynct
    if args.kernel != "auto":
        asynct.set_tuning(prefill=args.kernel)
    if args.profile:
        return profile(asynct, args.shapes, args.block_size)

    matmul_tflops = ceilings(args.out)["bf16_matmul_tflops"]
    torch.manual_seed(0)
    rows = []
    for batch, length in args.shapes:
        q, k, v, key_cache, value_cache, table, cu, kv_lens = prefill_inputs(batch, length, args.block_size)
        total = batch * length
        flops_causal = 4 * batch * HQ * length * length * D / 2

        row = {"batch": batch, "length": length}
        outs = {}
        for name, gate in {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}.items():
            # The batch is checked once; the timed calls skip the check (a host round trip).
            fn = lambda check=False: asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gate,
                                                    max_q_len=length, max_kv_len=length, check=check)
            outs[name] = fn(check=True)
            ms = median_ms(fn, warmup=3, reps=10)
            row[name + "_ms"] = ms
            row[name + "_tflops"] = flops_causal / (ms * 1e-3) / 1e12

        q4 = q.view(batch, length, HQ, D).transpose(1, 2)
        k4 = k.view(batch, length, HKV, D).transpose(1, 2)
        v4 = v.view(batch, length, HKV, D).transpose(1, 2)
        for backend, label in [(SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")]:
            for causal in (True, False):
                key = f"{label}_{'causal' if causal else 'full'}"
                try:
                    out = sdpa(q4, k4, v4, backend, causal)
                    ms = median_ms(lambda: sdpa(q4, k4, v4, backend, causal), warmup=3, reps=10)
                except RuntimeError as e:
                    row[key + "_tflops"] = None
                    continue
                flops = flops_causal * (1 if causal else 2)
                row[key + "_tflops"] = flops / (ms * 1e-3) / 1e12
                if causal and label == "cudnn":
                    row["softmax_rel_err_vs_cudnn"] = rel_err(outs["softmax"], out.transpose(1, 2).reshape(total, HQ, D))
        row["softmax_vs_cudnn_causal"] = row["softmax_tflops"] / row["cudnn_causal_tflops"] if row.get("cudnn_causal_tflops") else None
        row["async_vs_cudnn_causal"] = row["async_tflops"] / row["cudnn_causal_tflops"] if row.get("cudnn_causal_tflops") else None
        rows.append(row)
        del q, k, v, key_cache, value_cache
        torch.cuda.empty_cache()
    cases = []
    for case in (varlen_case, prefix_case):
        try:
            cases.append(case(asynct, args.block_size))
        except Exception as e:  # noqa: BLE001 (the equal-length rows are still written)
            print(f"bench_prefill: the {case.__name__} failed: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    write_json(args.out, f"prefill_bs{args.block_size}.json", {"matmul_tflops": matmul_tflops, "rows": rows,
                                                               "cases": cases})

    print(f"\nprefill, Hq={HQ} Hkv={HKV} D={D} bf16, block_size {args.block_size}; TFLOP/s "
          f"(matmul ceiling {matmul_tflops:.0f})")
    print(f"{'B x L':>10} {'async':>7} {'softmax':>8} {'cudnn c':>8} {'cudnn f':>8} {'flash c':>8} "
          f"{'async/cudnn':>11} {'soft/cudnn':>10} {'err':>8}")
    f = lambda x: f"{x:8.1f}" if x is not None else f"{'-':>8}"
    for r in rows:
        print(f"{r['batch']:>3} x {r['length']:<5} {r['async_tflops']:7.1f} {r['softmax_tflops']:8.1f} "
              f"{f(r.get('cudnn_causal_tflops'))} {f(r.get('cudnn_full_tflops'))} {f(r.get('flash_causal_tflops'))} "
              f"{(r['async_vs_cudnn_causal'] or 0):11.2f} {(r['softmax_vs_cudnn_causal'] or 0):10.2f} "
              f"{r.get('softmax_rel_err_vs_cudnn', float('nan')):8.1e}")

    print("\nvarlen and prefix cases, TFLOP/s (a missing anchor: PyTorch could not run it here)")
    for c in cases:
        label = (f"varlen, 16 prompts of 100..4096 ({c['tokens']} tokens)" if c["case"] == "varlen"
                 else f"prefix, {c['batch']} x ({c['cached']} cached + {c['new']} new)")
        anchors = {k[:-7]: v for k, v in c.items() if k.endswith("_tflops") and not k.startswith(("async_", "softmax_"))}
        best = max((v for v in anchors.values() if v), default=None)
        print(f"  {label}: async {c['async_tflops']:.1f}, softmax {c['softmax_tflops']:.1f}; "
              + ", ".join(f"{k} {v:.1f}" if v else f"{k} -" for k, v in anchors.items())
              + (f"; async / best {c['async_tflops'] / best:.2f}, softmax / best {c['softmax_tflops'] / best:.2f}" if best else ""))
        for k, v in c.items():
            if k.endswith("_missing"):
                print(f"    {k[:-8]} missing: {v}")
        err = c.get("softmax_rel_err_vs_cudnn", c.get("softmax_rel_err_vs_anchor"))
        if err is not None:
            print(f"    softmax against the anchor: relative error {err:.1e}")
        if "async_fp8_cache_tflops" in c:
            print(f"    over an e4m3 cache: async {c['async_fp8_cache_tflops']:.1f} "
                  f"({c['async_fp8_cache_tflops'] / c['async_tflops']:.2f}x the bf16 cache), softmax "
                  f"{c['softmax_fp8_cache_tflops']:.1f} ({c['softmax_fp8_cache_tflops'] / c['softmax_tflops']:.2f}x); "
                  f"output against the bf16 cache's: relative error async {c['async_fp8_cache_rel_err_vs_bf16']:.1e}, "
                  f"softmax {c['softmax_fp8_cache_rel_err_vs_bf16']:.1e}")


if __name__ == "__main__":
    main()
