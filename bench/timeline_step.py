"""Where a decode step's time goes on the GPU's own clock: reads the kernel timeline that
bench/kernel_timeline.cpp records (every kernel node of the replayed CUDA graphs, with its start
and end), takes a window of decode steps of the first model `asynct bench` runs (or, with --last N,
the process's last N steps of any kind: a server's prompt steps), and prints per kernel: calls per
step, time from its start to its end inside the graph, how far it starts after the kernel before it
ended (negative: it overlapped), and the step's idle time (no kernel running). Unlike Nsight Compute
(bench/profile_step.py), nothing is serialised.

  python3 bench/timeline_step.py TIMELINE.csv [--steps 40] [--run 0|1]
  python3 bench/timeline_step.py TIMELINE.csv --last 8   # each step's span, then the table
"""
import argparse
import collections
import csv
import re


def short_name(name, grid):
    base = re.sub(r"^void ", "", name)
    base = re.sub(r"\(anonymous namespace\)::|<unnamed>::|asynct::|kernels::", "", base)
    base = re.sub(r"\(.*$", "", base)  # drop the parameter list
    return f"{base[:60]} [{grid}]"


def decode_window(steps, args):
    """The middle --steps steps of run --run of consecutive all-decode steps."""
    decode = [i for i, s in enumerate(steps) if any("decode_stage1" in k[2] for k in s)
              and not any("prefill" in k[2] for k in s)]
    if not decode:
        raise SystemExit("no decode steps in the timeline")
    # Each model's decode steps form a run of consecutive indices.
    runs = [[decode[0]]]
    for i in decode[1:]:
        if i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    if args.run >= len(runs):
        raise SystemExit(f"only {len(runs)} runs of decode steps in the timeline")
    run = runs[args.run]
    middle = len(run) // 2
    window = run[max(1, middle - args.steps // 2): middle + args.steps // 2]
    print(f"{len(steps)} steps in the timeline, {len(run)} decode steps in run {args.run}; "
          f"averaging steps {window[0]}..{window[-1]}")
    return window


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline")
    ap.add_argument("--steps", type=int, default=40, help="decode steps to average over")
    ap.add_argument("--run", type=int, default=0,
                    help="which run of consecutive decode steps (asynct bench: 0 the first model, 1 the second)")
    ap.add_argument("--last", type=int, default=0,
                    help="the last N steps of any kind instead, each timed from its own first kernel "
                         "(steps apart in time, as a server's requests one at a time are)")
    args = ap.parse_args()

    with open(args.timeline) as f:
        rows = [r for r in csv.DictReader(f)]
    kernels = sorted(((int(r["start_ns"]), int(r["end_ns"]), short_name(r["name"], r["grid"])) for r in rows))
    # Steps end with the sampler's kernel (greedy: the logits' summary; sampled: the device draw); a
    # decode step has decode attention in it.
    steps, current = [], []
    for k in kernels:
        current.append(k)
        if "summarize_logits" in k[2] or "sample_rows" in k[2]:
            steps.append(current)
            current = []
    if args.last:
        if len(steps) < args.last:
            raise SystemExit(f"only {len(steps)} steps in the timeline")
        window = list(range(len(steps) - args.last, len(steps)))
        print(f"{len(steps)} steps in the timeline; the last {args.last}, each from its first kernel:")
    else:
        window = decode_window(steps, args)
    per_kernel = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])  # calls, duration, start gap, added
    wall = busy = 0.0
    for i in window:
        step = steps[i]
        previous_end = step[0][0] if args.last else steps[i - 1][-1][1]
        wall += step[-1][1] - previous_end
        busy_before = busy
        prev_end = previous_end  # the latest end of the kernels started so far
        for start, end, name in step:
            added = max(0, end - max(start, prev_end))  # summed over the step: its busy time
            entry = per_kernel[name]
            entry[0] += 1
            entry[1] += end - start
            entry[2] += start - prev_end
            entry[3] += added
            busy += added
            prev_end = max(prev_end, end)
        if args.last:
            print(f"  step {i}: {len(step)} kernels, {(step[-1][1] - previous_end) / 1e6:.3f} ms from first "
                  f"start to last end, some kernel running {(busy - busy_before) / 1e6:.3f} ms")
    n = len(window)
    print(f"step {wall / n / 1e6:.3f} ms on the GPU clock; some kernel running {busy / n / 1e6:.3f} ms, "
          f"idle {(wall - busy) / n / 1e6:.3f} ms")
    print(f"{'kernel':<74} {'calls':>6} {'us/call':>8} {'start gap':>10} {'added us':>9} {'added us/step':>14}")
    for name, (calls, duration, gap, added) in sorted(per_kernel.items(), key=lambda kv: -kv[1][3]):
        print(f"{name:<74} {calls / n:6.1f} {duration / calls / 1e3:8.2f} {gap / calls / 1e3:10.2f} "
              f"{added / calls / 1e3:9.2f} {added / n / 1e3:14.1f}")


if __name__ == "__main__":
    main()
