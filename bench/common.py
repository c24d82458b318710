"""Shared pieces of the benchmarks: timing with CUDA graphs and events, the ceilings, the library path."""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def median_ms(fn, warmup=3, reps=15, inner=10, graph=True):
    """Median GPU time of one fn() call in milliseconds.

    `inner` calls are captured in a CUDA graph (falling back to a plain loop when fn cannot be
    captured) and each replay is timed with CUDA events behind a short GPU sleep, so that the
    host's launch overhead (Python, ctypes) is not counted and kernels run back to back, as in
    the engine's decode graphs. fn should rotate its inputs if it must not be timed out of L2.
    graph=False times plain calls (for the ceilings: a graph turns a copy into a copy-engine
    transfer, slower than a copy kernel, and long matmuls do not need it).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    try:
        if not graph:
            raise RuntimeError("plain calls")
        captured = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(captured):
            for _ in range(inner):
                fn()
        run = captured.replay
    except RuntimeError:
        torch.cuda.synchronize()
        def run():
            for _ in range(inner):
                fn()
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # ~0.1 ms of GPU work while the host queues the rest
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
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


def shape_list(script):
    """An argparse type for "16x1024,1x16384" -> [(16, 1024), (1, 16384)], its errors naming `script`."""
    def parse(text):
        try:
            shapes = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
        except ValueError:
            shapes = []
        if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise SystemExit(f"{script}: --shapes {text!r}: expected AxB[,AxB...], e.g. 32x4096")
        return shapes
    return parse


def parse_args(doc, block_size=False, extra=None):
    """The arguments every kernel benchmark takes (extra(parser) adds a script's own); also points
    python/asynct at --lib."""
    parser = argparse.ArgumentParser(description=doc)
    if extra:
        extra(parser)
    parser.add_argument("--lib", required=True, help="build directory holding lib/libasynct.so")
    parser.add_argument("--out", required=True, help="output folder (holds ceilings.json)")
    parser.add_argument("--tune", action="append", default=[], metavar="ASYNCT_NAME=VALUE",
                        help="a kernel override (asynct.set_tuning); also taken from the environment")
    if block_size:
        parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    use_library(args.lib)
    apply_tuning(args.tune)
    return args


# The kernel overrides (src/kernels/common/tuning.h): the library reads no environment, so a
# benchmark passes ASYNCT_* variables set for it, then --tune's, through asynct.set_tuning.
TUNING_NAMES = ("ASYNCT_GEMM", "ASYNCT_PREFILL", "ASYNCT_PREFILL_SPLITS", "ASYNCT_PREFILL_GROUP",
                "ASYNCT_PREFILL_CTAS", "ASYNCT_SKINNY_TILE", "ASYNCT_SKINNY_SPLITS", "ASYNCT_SKINNY_WGMMA", "ASYNCT_PDL",
                "ASYNCT_GRAPH_PREFILL")


def apply_tuning(settings=()):
    import asynct
    overrides = {name: os.environ[name] for name in TUNING_NAMES if os.environ.get(name)}
    for setting in settings:
        name, _, value = setting.partition("=")
        overrides[name] = value or None
    if overrides:
        asynct.set_tuning(**overrides)
