"""One call per gate of a kernel on one bench_decode.py / bench_prefill.py shape, for a profiler
to look at, e.g.

  ncu -k regex:decode_stage1 --section SpeedOfLight --section WarpStateStats \
      python3 bench/profile_kernels.py --lib build/gpu decode --seqs 1 --ctx 131072
  ncu -k regex:prefill_kernel --section SpeedOfLight --section WarpStateStats \
      python3 bench/profile_kernels.py --lib build/gpu prefill --batch 4 --length 4096

Hq=16, Hkv=8, D=128, bf16, standard-normal Q/K/V, alpha=sigma=gamma=1, W=3.
"""
import argparse

import torch

from common import use_library


def run_decode(asynct, gates, args):
    from bench_decode import decode_inputs

    q, key_cache, value_cache, table, kv_lens = decode_inputs(args.seqs, args.ctx, args.block_size)
    for gate in gates:
        asynct.decode(q, key_cache, value_cache, table, kv_lens, gate, max_kv_len=args.ctx)


def run_prefill(asynct, gates, args):
    from bench_prefill import prefill_inputs

    q, k, v, key_cache, value_cache, table, cu, kv_lens = prefill_inputs(args.batch, args.length, args.block_size)
    for gate in gates:
        asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gate,
                       max_q_len=args.length, max_kv_len=args.length)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="the build directory holding libasynct")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--gates", default="softmax,async")
    kernels = ap.add_subparsers(dest="kernel", required=True)
    decode = kernels.add_parser("decode")
    decode.add_argument("--seqs", type=int, default=1)
    decode.add_argument("--ctx", type=int, default=131072)
    prefill = kernels.add_parser("prefill")
    prefill.add_argument("--batch", type=int, default=4)
    prefill.add_argument("--length", type=int, default=4096)
    args = ap.parse_args()
    use_library(args.lib)
    import asynct

    from bench_decode import HQ

    torch.manual_seed(0)
    by_name = {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}
    gates = [by_name[name] for name in args.gates.split(",")]
    (run_decode if args.kernel == "decode" else run_prefill)(asynct, gates, args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
