"""The two ceilings every asynct benchmark is read against, measured in the same run:
device-copy bandwidth (bytes read + written per second) and the bf16 matmul rate on random data.

Usage: python3 bench/ceilings.py [--json FILE]
"""
import argparse
import json

import torch

from common import median_ms


def measure():
    # 4 GiB copy: far past the 60 MB L2, so it measures HBM.
    n = 1 << 31
    src = torch.randn(n // 2, device="cuda", dtype=torch.float32).view(torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), inner=1, graph=False)
    copy_tb_s = 2 * src.numel() * src.element_size() / (copy_ms * 1e-3) / 1e12
    del src, dst

    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: a @ b, reps=20, inner=1, graph=False)
    mm_tflops = 2 * m**3 / (mm_ms * 1e-3) / 1e12
    return {
        "gpu": torch.cuda.get_device_name(),
        "copy_tb_per_s": round(copy_tb_s, 3),
        "bf16_matmul_tflops": round(mm_tflops, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    result = measure()
    print(f"ceilings on {result['gpu']}: copy {result['copy_tb_per_s']:.2f} TB/s (read+write), "
          f"bf16 matmul {result['bf16_matmul_tflops']:.0f} TFLOP/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
