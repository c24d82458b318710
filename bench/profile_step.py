"""Where a decode step's GPU time goes, kernel by kernel: runs one scenario of `asynct bench`
under Nsight Compute (every kernel node of the replayed CUDA graphs timed on its own, no cache
flush, clocks as they run) over a window of launches in the middle of the decode phase, and
prints each kernel's time per step, grouped (GEMMs, attention, norms, other), beside the
step's wall time measured without the profiler.

  python3 bench/profile_step.py --asynct build/gpu/src/asynct [--scenario decode_heavy_b32]

The first model the bench runs (AsyncT) is the one profiled. The sum of the kernels' times
against the wall time of a step is what launch gaps and host work cost.
"""
import argparse
import collections
import csv
import io
import re
import subprocess

GROUPS = [  # first match wins
    ("attention", re.compile(r"decode|prefill")),
    ("norms", re.compile(r"norm|rope", re.I)),
    ("GEMMs", re.compile(r"gemm|xmma|cutlass|nvjet|splitKreduce|skinny", re.I)),
    ("other", re.compile(r".")),
]


def group_of(name):
    return next(group for group, pattern in GROUPS if pattern.search(name))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asynct", required=True, help="the asynct binary")
    ap.add_argument("--scenario", default="decode_heavy_b32")
    ap.add_argument("--skip", type=int, default=20000, help="kernel launches to let pass before the window")
    ap.add_argument("--count", type=int, default=1600, help="kernel launches to time")
    ap.add_argument("--ncu", default="ncu")
    args = ap.parse_args()
    bench = [args.asynct, "bench", "--config", "1.7b", "--device", "cuda", "--scenario", args.scenario,
             "--repeat", "1", "--no-warmup"]
    profiled = subprocess.run(
        [args.ncu, "--graph-profiling", "node", "--metrics", "gpu__time_duration.sum", "--cache-control", "none",
         "--clock-control", "none", "--launch-skip", str(args.skip), "--launch-count", str(args.count), "--csv",
         "--page", "raw", *bench], capture_output=True, text=True)
    rows = [line for line in profiled.stdout.splitlines() if line.startswith('"')]
    if not rows:
        raise SystemExit(f"ncu gave no results:\n{profiled.stdout[-3000:]}\n{profiled.stderr[-3000:]}")
    table = [row for row in csv.DictReader(io.StringIO("\n".join(rows)))
             if re.fullmatch(r"[0-9.,]+", row.get("gpu__time_duration.sum", ""))]  # drops the units row
    # Greedy sampling summarises each step's logits once, last in the step: the kernels after one
    # summary up to and including the next are one whole step (the window's ragged ends, which
    # would count a step for a part of one, are dropped).
    ends = [i for i, row in enumerate(table) if "summarize_logits" in row["Kernel Name"]]
    if len(ends) < 2:
        raise SystemExit("fewer than two summarize_logits kernels in the window: widen --count")
    steps = len(ends) - 1
    times = collections.defaultdict(list)
    for row in table[ends[0] + 1:ends[-1] + 1]:
        name = row["Kernel Name"]
        # One skinny kernel instance serves several products: its grid (column tiles, splits)
        # tells them apart.
        if "skinny" in name and row.get("Grid Size"):
            name = f"{name.split('(')[0]} grid {row['Grid Size']}"
        times[name].append(float(row["gpu__time_duration.sum"].replace(",", "")))
    total = sum(sum(t) for t in times.values()) / steps
    print(f"{len(table)} kernel nodes timed, {steps} whole steps among them")
    print(f"{'kernel':<80} {'calls/step':>10} {'us/call':>9} {'us/step':>9}")
    grouped = collections.defaultdict(float)
    for name, t in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        grouped[group_of(name)] += sum(t) / steps / 1e3
        print(f"{name[:80]:<80} {len(t) / steps:10.1f} {sum(t) / len(t) / 1e3:9.2f} {sum(t) / steps / 1e3:9.1f}")
    print("per step (ms): " + ", ".join(f"{g} {v / 1e3:.3f}" for g, v in grouped.items()) +
          f"; kernels in all {total / 1e6:.3f}")
    plain = subprocess.run(bench, capture_output=True, text=True)
    print("without the profiler:\n" + "\n".join(line for line in (plain.stdout + plain.stderr).splitlines()
                                                 if "per step" in line or args.scenario in line))


if __name__ == "__main__":
    main()
