"""Norms at hidden 2048 for 1..16384 tokens: GB/s (bytes each kernel must move: inputs read
once, outputs written once) against the copy ceiling. UClipNorm (clip 1.0).

Usage: python3 bench/bench_norms.py --lib BUILD_DIR --out OUT_DIR
"""
import torch

from common import ceilings, median_ms, parse_args, write_json

HIDDEN = 2048
TOKENS = [1, 16, 128, 1024, 2048, 4096, 8192, 16384]


def main():
    args = parse_args(__doc__)
    import asynct

    copy_tb_s = ceilings(args.out)["copy_tb_per_s"]
    torch.manual_seed(0)
    w1 = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    rows = []
    for n in TOKENS:
        # Several input sets so that small sizes are not timed out of L2 alone.
        sets = max(1, min(64, (256 << 20) // (n * HIDDEN * 2 * 3)))
        xs = [torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        rs = [torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        outs = [torch.empty_like(x) for x in xs]
        row_bytes = n * HIDDEN * 2
        cases = {
            # name: (function of set index, bytes moved)
            "norm": (lambda i: asynct.norm(xs[i], w1, clip=1.0, out=outs[i]), 2 * row_bytes),
            "fused_add_norm": (lambda i: asynct.fused_add_norm(xs[i], rs[i], w1, clip=1.0, out=outs[i]),
                               4 * row_bytes),
            "post_attn_pre_mlp": (lambda i: asynct.post_attn_pre_mlp(xs[i], rs[i], w1, w2, clip=1.0,
                                                                      out=outs[i]), 4 * row_bytes),
        }
        def rotated_us(fn):
            """Median time of fn(i), i cycling over the input sets, in microseconds."""
            counter = [0]

            def step():
                fn(counter[0] % sets)
                counter[0] += 1
            return median_ms(step, warmup=10, reps=20) * 1e3

        row = {"tokens": n}
        for name, (fn, nbytes) in cases.items():
            row[name + "_us"] = rotated_us(fn)
            row[name + "_of_ceiling"] = nbytes / (row[name + "_us"] * 1e-6) / (copy_tb_s * 1e12)
        # For scale, on the same rotated sets: PyTorch's own RMSNorm (unfused, no clip), and a
        # plain copy of the same bytes as norm (x read, out written; x * 1 so that it is a
        # kernel, not a copy-engine transfer inside the graph): what any kernel of this size
        # can reach in this timing, launch and ramp-up included, unlike the ceiling, which is
        # measured on large buffers.
        for name, fn in (("torch_rms_norm", lambda i: torch.nn.functional.rms_norm(xs[i], (HIDDEN,), w1, 1e-6)),
                         ("torch_copy", lambda i: torch.mul(xs[i], 1.0, out=outs[i]))):
            row[name + "_us"] = rotated_us(fn)
        row["torch_copy_of_ceiling"] = 2 * row_bytes / (row["torch_copy_us"] * 1e-6) / (copy_tb_s * 1e12)
        rows.append(row)
        del xs, rs, outs
    write_json(args.out, "norms.json", {"copy_tb_per_s": copy_tb_s, "hidden": HIDDEN, "rows": rows})

    print(f"\nnorms, hidden {HIDDEN}, bf16; fraction of the {copy_tb_s:.2f} TB/s copy ceiling (us)")
    print(f"{'tokens':>7} {'norm':>14} {'fused_add':>14} {'post_attn_pre_mlp':>18} {'torch rms us':>12} "
          f"{'torch copy':>14}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['norm_of_ceiling']:6.2f} ({r['norm_us']:5.1f}) "
              f"{r['fused_add_norm_of_ceiling']:6.2f} ({r['fused_add_norm_us']:5.1f}) "
              f"{r['post_attn_pre_mlp_of_ceiling']:10.2f} ({r['post_attn_pre_mlp_us']:5.1f}) "
              f"{r['torch_rms_norm_us']:12.1f} {r['torch_copy_of_ceiling']:6.2f} ({r['torch_copy_us']:5.1f})")


if __name__ == "__main__":
    main()
