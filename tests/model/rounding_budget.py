"""Where the CUDA engine's logit error on an AsyncT checkpoint comes from, on the CPU.

The CUDA engine computes in fp32 but keeps its activations in bf16 at fixed points (GEMM inputs
and outputs, the KV cache, P before P V, the residual stream). This script runs the AsyncT
forward pass of python/asynct_reference in float32 and rounds to bf16 at exactly those points,
each one switchable, and prints the first-token logit error against the unrounded run for the
prompts of compare_with_pytorch.py: with every point on it models the engine (on the seed-11
test model it gives 0.6-4.8% where the engine measured 0.7-4.7% on an H200); with one point
off, what that rounding costs. It needs PyTorch (CPU is enough) and is not part of CI.

The rounding points, in the order of a layer:
  Hin    input_layernorm's output (the q/k/v GEMM's input) and the final norm's
  Gqkv   the q/k/v projections' output
  QK     q and k after their norms and RoPE (the KV cache, the attention's inputs)
  P      the gate's P, before P V (the tensor cores take bf16)
  O      the attention output
  Go     the o projection's output
  R      the residual stream as stored (the fused norms use the exact fp32 sum)
  Hpost  post_attention_layernorm's output (the MLP's input)
  Ggu    the gate/up projections' output
  A      SiLU(gate) * up
  Gdown  the down projection's output
(The Peri-LN output norms are computed in fp32 inside the fused norm kernels and added to the
residual unrounded, so they have no point of their own.)

With --seeds it prints, for each of several test models, the engine's model beside PyTorch's own
bf16 run (the comparison that sets compare_with_pytorch.py's AsyncT bar on the GPU).

Usage: python3 tests/model/rounding_budget.py --asynct build/release/src/asynct [--seed 11]
       python3 tests/model/rounding_budget.py --asynct build/release/src/asynct --seeds 11,12,13,14
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from asynct_reference.modeling_asynct import load_asynct, rotate_half  # noqa: E402
from compare_with_pytorch import PROMPTS  # noqa: E402

POINTS = ["Hin", "Gqkv", "QK", "P", "O", "Go", "R", "Hpost", "Ggu", "A", "Gdown"]


def to_bf16(x):
    return x.to(torch.bfloat16).float()


class RoundedForward:
    """The reference model's forward pass in float32, rounding to bf16 at the points in `on`."""

    def __init__(self, model):
        self.model = model

    def round(self, x, point, on):
        return to_bf16(x) if point in on else x

    def norm(self, module, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps)
        return y.clamp(-module.clip, module.clip) * module.weight

    def linear(self, module, x, point, on):
        return self.round(x @ module.weight.T, point, on)

    @staticmethod
    def rope(x, positions, theta):
        d = x.shape[-1]
        inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = positions.double()[:, None] * inv_freq[None]
        emb = torch.cat((angles, angles), -1)
        return (x.double() * emb.cos() + rotate_half(x.double()) * emb.sin()).float()

    def attention(self, a, h, positions, on):
        length = h.shape[0]
        q = self.linear(a.q_proj, h, "Gqkv", on).view(length, a.hq, a.d)
        k = self.linear(a.k_proj, h, "Gqkv", on).view(length, a.hkv, a.d)
        v = self.linear(a.v_proj, h, "Gqkv", on).view(length, a.hkv, a.d).transpose(0, 1)
        q = self.round(self.rope(self.norm(a.q_norm, q).transpose(0, 1), positions, a.theta), "QK", on)
        k = self.round(self.rope(self.norm(a.k_norm, k).transpose(0, 1), positions, a.theta), "QK", on)
        k = k.repeat_interleave(a.hq // a.hkv, 0)
        v = v.repeat_interleave(a.hq // a.hkv, 0)
        s = q @ k.transpose(-1, -2) / math.sqrt(a.d)
        relu = s.clamp_min(0)
        pooled = sum(F.pad(relu, (t, 0))[..., :length] for t in range(a.window)) / a.window
        shape = (-1, 1, 1)
        p = a.gate_gamma.view(shape) * (a.gate_alpha.view(shape) * (s - a.gate_sigma.view(shape) * pooled)).clamp(0, 1)
        p = self.round(p.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), 0.0), "P", on)
        o = self.round((p @ v).transpose(0, 1).reshape(length, -1), "O", on)
        return self.linear(a.o_proj, o, "Go", on)

    def mlp(self, m, h, on):
        gate = self.linear(m.gate_proj, h, "Ggu", on)
        up = self.linear(m.up_proj, h, "Ggu", on)
        return self.linear(m.down_proj, self.round(F.silu(gate) * up, "A", on), "Gdown", on)

    @torch.no_grad()
    def last_logits(self, ids, on):
        body = self.model.model
        positions = torch.arange(len(ids))
        # Each fused norm adds its block's output to the residual as stored (bf16) and normalises
        # the exact fp32 sum: `stored` is the former, `exact` the latter.
        exact = stored = body.embed_tokens.weight[torch.tensor(ids)]
        for layer in body.layers:
            h = self.round(self.norm(layer.input_layernorm, exact), "Hin", on)
            exact = stored + self.norm(layer.attn_output_layernorm, self.attention(layer.self_attn, h, positions, on))
            stored = self.round(exact, "R", on)
            h = self.round(self.norm(layer.post_attention_layernorm, exact), "Hpost", on)
            exact = stored + self.norm(layer.mlp_output_layernorm, self.mlp(layer.mlp, h, on))
            stored = self.round(exact, "R", on)
        h = self.round(self.norm(body.norm, exact), "Hin", on)
        return (h @ self.model.lm_head.weight.T)[-1].double()


@torch.no_grad()
def load_model(binary, seed, dtype):
    """The seed's random AsyncT checkpoint as a RoundedForward, and its unrounded logits."""
    with tempfile.TemporaryDirectory() as workdir:
        checkpoint = os.path.join(workdir, "asynct")
        subprocess.run([binary, "init-checkpoint", "--arch", "asynct", "--seed", str(seed), "--out", checkpoint],
                       check=True, stdout=subprocess.DEVNULL)
        forward = RoundedForward(load_asynct(checkpoint, dtype=dtype, device="cpu"))
    return forward, [forward.last_logits(p, set()) for p in PROMPTS] if dtype == torch.float32 else None


def report(forward, exact, label, on):
    errors = [((forward.last_logits(p, on) - ref).norm() / ref.norm()).item() for p, ref in zip(PROMPTS, exact)]
    print(f"{label:<28}" + " ".join(f"{e * 100:6.2f}%" for e in errors), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asynct", required=True, help="the asynct binary (writes the random checkpoint)")
    ap.add_argument("--seed", type=int, default=11, help="the checkpoint's seed (compare_with_pytorch uses 11)")
    ap.add_argument("--seeds", help="comma-separated seeds: only the engine's model against PyTorch's bf16 run")
    args = ap.parse_args()
    print(f"first-token logit error against float32, prompts of {', '.join(str(len(p)) for p in PROMPTS)} tokens")
    if args.seeds:
        for seed in map(int, args.seeds.split(",")):
            forward, exact = load_model(args.asynct, seed, torch.float32)
            report(forward, exact, f"seed {seed}: every point", set(POINTS))
            bf16 = load_model(args.asynct, seed, torch.bfloat16)[0].model
            errors = [((bf16(torch.tensor([p]))[0, -1].double() - ref).norm() / ref.norm()).item()
                      for p, ref in zip(PROMPTS, exact)]
            print(f"{f'seed {seed}: PyTorch in bf16':<28}" + " ".join(f"{e * 100:6.2f}%" for e in errors))
        return
    forward, exact = load_model(args.asynct, args.seed, torch.float32)
    report(forward, exact, "every point (the engine)", set(POINTS))
    for point in POINTS:
        report(forward, exact, f"every point but {point}", set(POINTS) - {point})
    for point in POINTS:
        report(forward, exact, f"{point} alone", {point})


if __name__ == "__main__":
    main()
