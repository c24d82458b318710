"""One prefill call per gate on one bench_prefill.py shape, for a profiler to look at, e.g.

  ncu -k regex:prefill_kernel --section SpeedOfLight --section WarpStateStats \
      python3 bench/profile_prefill.py --lib build/gpu --batch 4 --length 4096

Hq=16, Hkv=8, D=128, bf16, block_size 16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3.
"""
import argparse

import torch

from bench_prefill import HQ, prefill_inputs
from common import use_library


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="the build directory holding libasynct")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gates", default="softmax,async")
    args = ap.parse_args()
    use_library(args.lib)
    import asynct

    torch.manual_seed(0)
    q, k, v, key_cache, value_cache, table, cu, kv_lens = prefill_inputs(args.batch, args.length, args.block_size)
    gates = {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}
    for name in args.gates.split(","):
        asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gates[name],
                       max_q_len=args.length, max_kv_len=args.length)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
