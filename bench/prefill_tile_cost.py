"""What a query tile costs in the Hopper prefill kernel: a fixed part and a part per key tile.

Reads bench_prefill.py's JSON (its equal-length rows) and fits, for each kernel, the time of one
wave of CTAs as   fixed + per_visit x visits   by least squares, where a wave is 132 CTAs (one a
multiprocessor), a CTA is one 128-row query tile of one query head, and visits is the mean
number of 128-key tiles a causal query tile reads ((L / 128 + 1) / 2). Shapes with the same
number of tokens (B x L = 16384) all have 2048 query tiles, so between them only the visits
change: the fit separates what a tile costs whatever its length (loading Q and the first keys,
the first products before anything overlaps them, the output, the CTA's start and end) from
what each key tile adds. cuDNN's times are fitted the same way, as if it used the same tiles.

It also prints, per shape, the largest fixed cost that would meet the goals of bench/RESULTS.md
(async >= 1.15x cuDNN, softmax >= 1.0x) at the fitted per-visit cost.

Usage: python3 bench/prefill_tile_cost.py bench/results/prefill/r26_h200.json [--max-length 2048]
"""
import argparse
import json

HQ, D, BLOCK, SMS = 16, 128, 128, 132
GOALS = {"async": 1.15, "softmax": 1.0}


def fit(points):
    """Least squares of y = a + b x over [(x, y)]: (a, b, largest |residual|)."""
    n = len(points)
    sx, sy = sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    a = (sy - b * sx) / n
    return a, b, max(abs(y - a - b * x) for x, y in points)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="bench_prefill.py's output (prefill_bs16.json)")
    parser.add_argument("--max-length", type=int, default=2048, help="longest sequence length in the fit")
    args = parser.parse_args()
    with open(args.json) as f:
        rows = json.load(f)["rows"]

    shapes = []
    for r in rows:
        batch, length = r["batch"], r["length"]
        if length % BLOCK:
            continue
        waves = HQ * batch * (length // BLOCK) / SMS
        flops = 4 * batch * HQ * length * length * D / 2
        times = {"async": r["async_ms"] * 1e3, "softmax": r["softmax_ms"] * 1e3}
        if r.get("cudnn_causal_tflops"):
            times["cudnn"] = flops / (r["cudnn_causal_tflops"] * 1e12) * 1e6
        shapes.append({"batch": batch, "length": length, "waves": waves, "visits": (length / BLOCK + 1) / 2,
                       "times": times})

    fits = {}
    print(f"one wave of query tiles = fixed + per_visit x visits (shapes up to L = {args.max_length}):")
    for kernel in ("async", "softmax", "cudnn"):
        points = [(s["visits"], s["times"][kernel] / s["waves"]) for s in shapes
                  if s["length"] <= args.max_length and kernel in s["times"]]
        if len(points) < 3:
            continue
        fits[kernel] = fit(points)
        a, b, worst = fits[kernel]
        print(f"  {kernel:8s} fixed {a:5.2f} us a tile, {b:5.3f} us a key tile visited "
              f"({len(points)} shapes, largest residual {worst:4.2f} us)")

    print("\nper shape: us per wave, and the fixed cost a tile may have for the goal at the fitted per-visit cost")
    print("     B x L   visits   async  softmax   cudnn   async fixed <=   softmax fixed <=")
    for s in shapes:
        t = s["times"]
        line = f"{s['batch']:6d} x {s['length']:<6d} {s['visits']:5.1f} " + " ".join(
            f"{t[k] / s['waves']:8.2f}" if k in t else "       -" for k in ("async", "softmax", "cudnn"))
        if "cudnn" in t:
            for kernel in ("async", "softmax"):
                if kernel in fits:
                    wave_goal = t["cudnn"] / GOALS[kernel] / s["waves"]
                    line += f"   {wave_goal - fits[kernel][1] * s['visits']:8.2f} us"
        print(line)


if __name__ == "__main__":
    main()
