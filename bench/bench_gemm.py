"""Dense layers of the 1.7B model at decode-sized row counts: how fast each GEMM path reads the
weights (TB/s, and as a fraction of the copy ceiling), beside PyTorch's F.linear (cuBLAS).
At these row counts a product is a stream over the weights: the ceiling is the weight bytes
over the copy rate. The last table sums one decode step's GEMMs (28 layers and the LM head).

Usage: python3 bench/bench_gemm.py --lib BUILD_DIR --out OUT_DIR
       python3 bench/bench_gemm.py --lib BUILD_DIR --out OUT_DIR --profile ROWS,IN,OUT,PATH
         (runs that one product a few times and exits: for ncu)
"""
import torch

from common import ceilings, median_ms, parse_args, write_json

# (name, in, out, per layer): the 1.7B configuration (hidden 2048, 16 query and 8 KV heads of
# 128, intermediate 6144, vocabulary 151936).
SHAPES = [
    ("q", 2048, 2048, True),
    ("k|v", 2048, 1024, True),
    ("qkv fused", 2048, 4096, False),
    ("o", 2048, 2048, True),
    ("gate_up", 2048, 12288, True),
    ("down", 6144, 2048, True),
    ("lm_head", 2048, 151936, False),
]
LAYERS = 28
ROWS = [1, 16, 32, 64]
PATHS = ["torch", "cublaslt", "tuned", "skinny"]


def run_path(asynct, path, x, w, y):
    if path == "torch":
        torch.mm(x, w.t(), out=y)
    else:
        asynct.linear(x, w, out=y, path=path)


def main():
    def options(p):
        p.add_argument("--profile", help="ROWS,IN,OUT,PATH")
        p.add_argument("--rows", help="comma-separated row counts (default: all)")
        p.add_argument("--paths", help="comma-separated paths (default: all)")
    args = parse_args(__doc__, extra=options)
    rows_wanted = [int(r) for r in args.rows.split(",")] if args.rows else ROWS
    paths = args.paths.split(",") if args.paths else PATHS
    import asynct

    if args.profile:
        rows, k, n, path = args.profile.split(",")
        x = torch.randn(int(rows), int(k), device="cuda", dtype=torch.bfloat16)
        w = torch.randn(int(n), int(k), device="cuda", dtype=torch.bfloat16) * 0.02
        y = torch.empty(int(rows), int(n), device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            run_path(asynct, path, x, w, y)
        torch.cuda.synchronize()
        return

    copy_tb_s = ceilings(args.out)["copy_tb_per_s"]
    torch.manual_seed(0)
    results = []
    for name, k, n, _ in SHAPES:
        w_bytes = n * k * 2
        # Enough weight copies that the rotation is not served from the 50 MB L2.
        copies = max(1, min(32, (256 << 20) // w_bytes))
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for rows in rows_wanted:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            expected = torch.nn.functional.linear(x.float(), ws[0].float())
            row = {"shape": name, "in": k, "out": n, "rows": rows, "weight_mb": w_bytes / 1e6}
            for path in paths:
                run_path(asynct, path, x, ws[0], y)  # first call: a tuned path times its candidates here
                err = ((y.float() - expected).norm() / expected.norm()).item()
                counter = [0]

                def step():
                    run_path(asynct, path, x, ws[counter[0] % copies], y)
                    counter[0] += 1
                ms = median_ms(step, warmup=3, reps=15)
                row[path + "_us"] = ms * 1e3
                row[path + "_tb_s"] = w_bytes / (ms * 1e-3) / 1e12
                row[path + "_err"] = err
            results.append(row)
            print(f"  {name:>9} rows {rows:>3}: " + "  ".join(
                f"{p} {row[p + '_us']:7.1f} us" for p in paths), flush=True)
        del ws

    # One decode step's GEMMs at each row count, per path.
    steps = []
    for rows in rows_wanted:
        by = {(r["shape"], r["rows"]): r for r in results}
        step = {"rows": rows}
        weight_bytes = sum(k * n * 2 * (2 if name == "k|v" else 1) * LAYERS
                           for name, k, n, per_layer in SHAPES if per_layer) + 2048 * 151936 * 2
        for path in paths:
            us = sum(by[(name, rows)][path + "_us"] * (2 if name == "k|v" else 1) * LAYERS
                     for name, _, _, per_layer in SHAPES if per_layer) + by[("lm_head", rows)][path + "_us"]
            step[path + "_ms"] = us / 1e3
        step["floor_ms"] = weight_bytes / (copy_tb_s * 1e12) * 1e3
        steps.append(step)
    write_json(args.out, "gemm.json", {"copy_tb_per_s": copy_tb_s, "rows": results, "decode_step": steps})

    print(f"\nGEMM, weights read as a fraction of the {copy_tb_s:.2f} TB/s copy ceiling (max rel err)")
    print(f"{'shape':>9} {'rows':>4} {'MB':>6} " + " ".join(f"{p:>9}" for p in paths))
    for r in results:
        print(f"{r['shape']:>9} {r['rows']:>4} {r['weight_mb']:6.1f} " +
              " ".join(f"{r[p + '_tb_s'] / copy_tb_s:9.2f}" for p in paths) +
              f"   ({max(r[p + '_err'] for p in paths):.1e})")
    print(f"\none decode step's GEMMs (q, k, v, o, gate_up, down x {LAYERS} + lm_head), ms")
    print(f"{'rows':>4} {'floor':>7} " + " ".join(f"{p:>9}" for p in paths))
    for s in steps:
        print(f"{s['rows']:>4} {s['floor_ms']:7.3f} " + " ".join(f"{s[p + '_ms']:9.3f}" for p in paths))


if __name__ == "__main__":
    main()
