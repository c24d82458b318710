"""Where a kernel's time goes, by instruction: reads Nsight Compute's source page (SASS, with the
PC-sampling stall reasons per instruction) and prints, for each kernel in it, the stall shares,
the code's parts grouped by how often their instructions ran, and the instructions with the
most samples.

A kernel's parts show up as groups of instructions with the same execution count: in a prefill
kernel, a consumer warp's per-tile code runs (warps x tiles) times, the producer's per-tile code
(producer warps x tiles) times, the prologue once a warp. Bucket width: --bucket (executions).

Usage, on the GPU machine (the report holds the source only with --import-source):
  ncu --set full --import-source yes -k regex:prefill_hopper_kernel --launch-skip 1 --launch-count 2 \\
      -o rep python3 bench/bench_prefill.py --lib build/gpu --out OUT --shapes 1x16384 --profile
  ncu -i rep.ncu-rep --page source --print-source sass --csv | gzip > source.csv.gz
then anywhere:  python3 bench/ncu_source.py source.csv.gz [--top 12] [--bucket 8000]
"""
import argparse
import collections
import csv
import gzip


def kernels(path):
    """[(kernel name, header, rows)] from the source page's CSV (plain or gzipped); a kernel that
    the page lists twice is kept once."""
    opener = gzip.open if path.endswith(".gz") else open
    out, seen, current = [], set(), None
    with opener(path, "rt") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                current = None if row[1] in seen else {"name": row[1], "header": None, "rows": []}
                if current:
                    seen.add(row[1])
                    out.append(current)
            elif current is not None and row[0] == "Address":
                current["header"] = row
            elif current is not None and current["header"]:
                current["rows"].append(row)
    return out


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def summary(kernel, top, bucket):
    header = kernel["header"]
    col = {name: i for i, name in enumerate(header)}
    stalls = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    rows = kernel["rows"]
    samples = lambda r: number(r[col["# Samples"]])
    executed = lambda r: number(r[col["Instructions Executed"]])
    total = sum(samples(r) for r in rows) or 1.0
    lines = [f"## {kernel['name'][:150]}", f"{int(total)} samples"]
    by_stall = collections.Counter()
    for r in rows:
        for s in stalls:
            by_stall[s] += number(r[col[s]])
    lines.append("stalls: " + ", ".join(f"{s[6:]} {v / total * 100:.1f}%" for s, v in by_stall.most_common(10)))
    parts = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        part = parts[round(executed(r) / bucket)]
        part[0] += 1
        part[1] += samples(r)
    lines.append("parts (executions: instructions, share of the samples):")
    for key, (count, s) in sorted(parts.items(), key=lambda kv: -kv[1][1])[:8]:
        lines.append(f"  ~{key * bucket / 1000:.0f}k: {count} instructions, {s / total * 100:.1f}%")
    lines.append("instructions with the most samples (share, executions, top stalls):")
    for r in sorted(rows, key=samples, reverse=True)[:top]:
        reasons = sorted(((number(r[col[s]]), s[6:]) for s in stalls), reverse=True)[:2]
        why = " ".join(f"{name} {v / total * 100:.1f}" for v, name in reasons if v)
        lines.append(f"  {samples(r) / total * 100:5.2f}% x{executed(r) / 1000:.0f}k  {r[1].strip()[:60]:60s} {why}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output (.csv or .csv.gz)")
    parser.add_argument("--top", type=int, default=12, help="instructions listed per kernel")
    parser.add_argument("--bucket", type=int, default=8000, help="executions per part's bucket")
    args = parser.parse_args()
    found = kernels(args.csv)
    if not found:
        raise SystemExit(f"ncu_source: no kernel with a source page in {args.csv}")
    print("\n\n".join(summary(k, args.top, args.bucket) for k in found))


if __name__ == "__main__":
    main()
