#!/usr/bin/env python3
"""Where bf16 activations move a Llama model's first-token logits: the numpy reference
(llama_numpy_reference.py) in float32, with its activations rounded to bfloat16 where the CUDA
engine stores them, against itself in float32, on golden.py's chat prompts.

    python3 tests/model/bf16_error_budget.py --model ~/.cache/asynct/smollm2-135m-instruct

The rounding points (each a tensor the engine keeps in bf16 between kernels; the arithmetic
inside a kernel stays float32, as the engine's does):
  residual   the residual stream after each add
  norm       each RMSNorm's output
  qkv        the q, k, v projections, and q, k after RoPE
  probs      attention's probabilities as the P V product reads them
  attn       attention's output
  proj       the o and down projections' outputs
  mlp        the SwiGLU product (silu(gate) * up; gate and up as the gate_up product stores them)
It prints, per prompt, the relative (Frobenius) error of the logits with every point rounded (the
engine's arithmetic), with every point but one, and with one alone. compare_with_transformers.py
measures the engine itself; this says which stores its distance comes from.
Needs numpy, tokenizers and jinja2 (as llama_numpy_reference.py finds them).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

POINTS = ("residual", "norm", "qkv", "probs", "attn", "proj", "mlp")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HuggingFace LlamaForCausalLM directory")
    parser.add_argument("--cache", default=os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")),
                        help="where python-gguf/ (numpy) and python/ (tokenizers, jinja2) are")
    args = parser.parse_args()
    import llama_numpy_reference as reference
    reference.add_cache_paths(args.cache)
    import numpy as np
    import tokenizers

    import golden

    def bf16(x):
        """Round-to-nearest-even to bfloat16, kept in float32 (finite inputs)."""
        bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return bits.view(np.float32)

    class Rounded(reference.Llama):
        """The reference's forward pass with bf16 stores at the chosen points."""

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.points = set()

        def r(self, point, x):
            return bf16(x) if point in self.points else x

        def attention(self, q, k, v, positions):
            group = self.heads // self.kv_heads
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(self.head_dim))
            future = np.arange(k.shape[0])[None, :] > positions[:, None]
            scores = np.where(future[None], -np.inf, scores)
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            total = p.sum(axis=-1, keepdims=True)  # the running sum stays float32
            return np.einsum("hts,shd->thd", self.r("probs", p), v) / total.transpose(1, 0, 2)

        def forward(self, ids, cache):
            w, n = self.w, len(ids)
            positions = np.arange(n)
            x = w["model.embed_tokens.weight"][ids]
            for i in range(self.layers):
                p = f"model.layers.{i}."
                h = self.r("norm", self.rms_norm(x, w[p + "input_layernorm.weight"]))
                q = self.r("qkv", h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, self.heads, self.head_dim)
                k = self.r("qkv", h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, self.kv_heads, self.head_dim)
                v = self.r("qkv", h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, self.kv_heads, self.head_dim)
                q, k = self.r("qkv", self.rope(q, positions)), self.r("qkv", self.rope(k, positions))
                attn = self.r("attn", self.attention(q, k, v, positions).reshape(n, -1))
                x = self.r("residual", x + self.r("proj", attn @ w[p + "self_attn.o_proj.weight"].T))
                h = self.r("norm", self.rms_norm(x, w[p + "post_attention_layernorm.weight"]))
                gate = self.r("mlp", h @ w[p + "mlp.gate_proj.weight"].T)
                up = self.r("mlp", h @ w[p + "mlp.up_proj.weight"].T)
                act = self.r("mlp", gate / (1.0 + np.exp(-gate)) * up)
                x = self.r("residual", x + self.r("proj", act @ w[p + "mlp.down_proj.weight"].T))
            return self.r("norm", self.rms_norm(x[-1], w["model.norm.weight"])) @ w["lm_head.weight"].T

    model = Rounded(args.model, np)
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    variants = [("all", set(POINTS))] + [(f"all but {p}", set(POINTS) - {p}) for p in POINTS] + [(p, {p}) for p in POINTS]
    print(f"relative error of the first-token logits against float32 ({args.model})")
    print(f"{'rounded':18}" + "".join(f"{golden.PROMPTS.index(t) + 1:>10}" for t in golden.PROMPTS) + "       max")
    rows = {}
    prompts = [tokenizer.encode(reference.render_chat(args.model, t), add_special_tokens=False).ids for t in golden.PROMPTS]
    model.points = set()
    exact = [model.forward(np.array(ids), []).astype(np.float64) for ids in prompts]
    for name, points in variants:
        model.points = points
        errors = []
        for ids, want in zip(prompts, exact):
            got = model.forward(np.array(ids), []).astype(np.float64)
            errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
        rows[name] = errors
        print(f"{name:18}" + "".join(f"{e:10.2e}" for e in errors) + f"{max(errors):10.2e}", flush=True)
    for i, t in enumerate(golden.PROMPTS):
        print(f"  {i + 1}: {t}")


if __name__ == "__main__":
    main()
