"""The SM clock and the power each prefill kernel runs at when it runs without pause: asynct's
two gates and cuDNN SDPA, each launched back to back for a few seconds while nvidia-smi samples
the GPU every 100 ms. bench_prefill.py times ten launches back to back, a stream like this one;
a single launch (under ncu, say) may run at a higher clock than a sustained stream holds, so
this says how much of a kernel's rate is the clock it is held to, and whether ours and the
anchor are held to the same one. A bf16 matmul (cuBLAS, 8192^3) runs the same way first: the
tensor cores alone at the clock the power limit leaves them.

Usage: python3 bench/prefill_clock.py --lib BUILD_DIR --out OUT_DIR [--shapes 16x1024,1x16384]
       [--seconds 3]
"""
import subprocess
import time

import torch
from torch.nn.attention import SDPBackend

from bench_prefill import HKV, HQ, D, prefill_inputs, sdpa, shape_list
from common import parse_args, write_json

FIELDS = "clocks.sm,power.draw,clocks_event_reasons.active"


def sampler():
    """nvidia-smi printing FIELDS every 100 ms until terminated."""
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_sustained(fn, seconds):
    """fn() back to back for `seconds` (after a warm-up); (ms a call, [(MHz, W, reasons)] sampled
    while it ran, the first half second dropped)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    probe = sampler()
    start = time.time()
    calls = 0
    while time.time() - start < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()
    elapsed = time.time() - start
    probe.terminate()
    lines = probe.communicate()[0].strip().splitlines()
    samples = []
    for line in lines[5:]:  # (~0.5 s: the sampler's start and the clock's ramp)
        parts = [p.strip() for p in line.split(",")]
        try:
            samples.append((float(parts[0]), float(parts[1]), parts[2]))
        except (ValueError, IndexError):
            raise SystemExit(f"prefill_clock: nvidia-smi printed {line!r}")
    if not samples:
        raise SystemExit("prefill_clock: no samples from nvidia-smi; raise --seconds")
    return elapsed / calls * 1e3, samples


def main():
    def extra(parser):
        parser.add_argument("--shapes", type=shape_list, default=[(16, 1024), (1, 16384)])
        parser.add_argument("--seconds", type=float, default=3.0)
    args = parse_args(__doc__, extra=extra)
    import asynct

    rows = []
    print("kernel run back to back: ms a call, SM clock MHz (mean, min), power W (mean), clock event reasons seen")

    def measure(label, fn, flops, **keys):
        ms, samples = run_sustained(fn, args.seconds)
        clocks = [s[0] for s in samples]
        power = [s[1] for s in samples]
        reasons = sorted({s[2] for s in samples})
        row = dict(keys, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, sm_mhz_mean=sum(clocks) / len(clocks),
                   sm_mhz_min=min(clocks), power_w_mean=sum(power) / len(power), event_reasons=reasons,
                   samples=len(samples))
        rows.append(row)
        print(f"  {label:22s} {ms:8.3f} ms {row['tflops']:6.1f} TFLOP/s   {row['sm_mhz_mean']:6.0f} MHz "
              f"(min {row['sm_mhz_min']:.0f})  {row['power_w_mean']:5.0f} W  {' '.join(reasons)}")

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    measure("matmul 8192^3", lambda: a @ b, 2 * n**3, kernel="matmul", n=n)
    del a, b
    for batch, length in args.shapes:
        q, k, v, key_cache, value_cache, table, cu, kv_lens = prefill_inputs(batch, length, 16)
        q4 = q.view(batch, length, HQ, D).transpose(1, 2)
        k4 = k.view(batch, length, HKV, D).transpose(1, 2)
        v4 = v.view(batch, length, HKV, D).transpose(1, 2)
        kernels = {
            name: (lambda gate=gate: asynct.prefill(q, k, v, key_cache, value_cache, table, cu, kv_lens, gate,
                                                    max_q_len=length, max_kv_len=length, check=False))
            for name, gate in {"async": asynct.Gate.async_(HQ), "softmax": asynct.Gate.softmax()}.items()
        }
        kernels["cudnn"] = lambda: sdpa(q4, k4, v4, SDPBackend.CUDNN_ATTENTION, True)
        flops = 4 * batch * HQ * length * length * D / 2
        for name, fn in kernels.items():
            measure(f"{batch:3d} x {length:<6d} {name}", fn, flops, batch=batch, length=length, kernel=name)
    write_json(args.out, "prefill_clock.json", {"rows": rows})


if __name__ == "__main__":
    main()
