"""Shared pieces of the benchmarks: timing with CUDA events, the ceilings, the library path."""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def median_ms(fn, warmup=5, reps=30):
    """Median time of fn() in milliseconds, timed with CUDA events after a warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def use_library(build_dir):
    """Points python/asynct at the libasynct.so of a build directory."""
    os.environ["ASYNCT_LIB"] = os.path.join(build_dir, "lib", "libasynct.so")


def ceilings(out_dir):
    """The ceilings measured earlier in the same run (bench/ceilings.py --json)."""
    with open(os.path.join(out_dir, "ceilings.json")) as f:
        return json.load(f)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def write_json(out_dir, name, payload):
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(payload, f, indent=2)


def parse_args(doc, block_size=False):
    """The arguments every kernel benchmark takes; also points python/asynct at --lib."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--lib", required=True, help="build directory holding lib/libasynct.so")
    parser.add_argument("--out", required=True, help="output folder (holds ceilings.json)")
    if block_size:
        parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    use_library(args.lib)
    return args
