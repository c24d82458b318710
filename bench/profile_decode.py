"""One decode call per gate on one bench_decode.py shape, for a profiler to look at, e.g.

  ncu -k regex:decode_stage1 --section SpeedOfLight --section WarpStateStats \
      python3 bench/profile_decode.py --lib build/gpu --seqs 1 --ctx 131072

Hq=16, Hkv=8, D=128, bf16, block_size 16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3.
"""
import argparse
import os
import sys

import torch

HQ, HKV, D = 16, 8, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="the build directory holding libasynct")
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gates", default="softmax,async")
    args = ap.parse_args()
    os.environ["ASYNCT_LIB"] = os.path.join(args.lib, "lib", "libasynct.so")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import asynct

    bs, seqs, ctx = args.block_size, args.seqs, args.ctx
    blocks_per_seq = (ctx + bs - 1) // bs
    nb = seqs * blocks_per_seq
    torch.manual_seed(0)
    key_cache = torch.randn(nb, bs, HKV, D, device="cuda", dtype=torch.bfloat16)
    value_cache = torch.randn_like(key_cache)
    table = torch.randperm(nb, device="cuda", dtype=torch.int32).view(seqs, blocks_per_seq)
    q = torch.randn(seqs, HQ, D, device="cuda", dtype=torch.bfloat16)
    kv_lens = torch.full((seqs,), ctx, device="cuda", dtype=torch.int32)
    gates = {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}
    for name in args.gates.split(","):
        asynct.decode(q, key_cache, value_cache, table, kv_lens, gates[name], max_kv_len=ctx)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
