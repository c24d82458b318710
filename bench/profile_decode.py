"""One decode call per gate on one bench_decode.py shape, for a profiler to look at, e.g.

  ncu -k regex:decode_stage1 --section SpeedOfLight --section WarpStateStats \
      python3 bench/profile_decode.py --lib build/gpu --seqs 1 --ctx 131072

Hq=16, Hkv=8, D=128, bf16, block_size 16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3.
"""
import argparse

import torch

from bench_decode import HQ, decode_inputs
from common import use_library


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="the build directory holding libasynct")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gates", default="softmax,async")
    args = ap.parse_args()
    use_library(args.lib)
    import asynct

    torch.manual_seed(0)
    q, key_cache, value_cache, table, kv_lens = decode_inputs(args.seqs, args.ctx, args.block_size)
    gates = {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}
    for name in args.gates.split(","):
        asynct.decode(q, key_cache, value_cache, table, kv_lens, gates[name], max_kv_len=args.ctx)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
