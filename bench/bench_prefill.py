"""Prefill attention TFLOP/s (causal counts half): asynct's prefill (async and softmax gates,
pure prefill writing the paged cache) against cuDNN SDPA (and flash), Hq=16, Hkv=8, D=128,
bf16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3. The kernel is the one launch_prefill
picks (on Hopper the wgmma kernel); --kernel portable measures the portable one
(asynct.set_tuning(prefill=...)).

Usage: python3 bench/bench_prefill.py --lib BUILD_DIR --out OUT_DIR [--block-size 16]
       [--kernel auto|portable|hopper]
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import ceilings, median_ms, parse_args, rel_err, write_json

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


def main():
    args = parse_args(__doc__, block_size=True, extra=lambda p: p.add_argument(
        "--kernel", choices=["auto", "portable", "hopper"], default="auto", help="which prefill kernel runs"))
    import asynct
    if args.kernel != "auto":
        asynct.set_tuning(prefill=args.kernel)

    matmul_tflops = ceilings(args.out)["bf16_matmul_tflops"]
    torch.manual_seed(0)
    rows = []
    for batch, length in SHAPES:
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
    write_json(args.out, f"prefill_bs{args.block_size}.json", {"matmul_tflops": matmul_tflops, "rows": rows})

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


if __name__ == "__main__":
    main()
