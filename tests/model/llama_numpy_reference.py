#!/usr/bin/env python3
"""LlamaForCausalLM in plain numpy: greedily continues a chat prompt over a HuggingFace directory.

    python3 tests/model/llama_numpy_reference.py --model DIR --prompt "What is the capital of France?"

A CPU cross-check written for clarity, not speed: the forward pass of transformers'
LlamaForCausalLM (RMSNorm, rotate-half RoPE with rope_theta, grouped-query attention, SwiGLU,
tied or separate lm_head) on bf16 or float32 weights, with a KV cache. Every operation computes
in --dtype: float32 (the default, transformers' own precision) or float64 (exact bf16 weights,
float64 activations: a reference whose own rounding is far below float32's). The prompt goes
through the directory's chat template (jinja2 as transformers sets it up) and HuggingFace
tokenizers; it prints the prompt's ids, the greedy ids and the text.

--write-golden PATH runs golden.py's prompts instead (64 greedy steps each, through EOS) and
writes the golden file tests/model/check_golden.py checks the engine against (golden.py has the
format; compare_with_transformers.py --write-golden writes the same from transformers):

    python3 tests/model/llama_numpy_reference.py --model DIR --dtype float64 --write-golden golden.json

--gguf-qk-order puts q_proj / k_proj rows back into llama.cpp's interleaved RoPE order (what a
GGUF converter that forgot to undo it would write): the text should then be garbage, which is
how scripts/gguf_to_hf.py's un-permutation is checked.

Needs numpy, tokenizers and jinja2: from $ASYNCT_CACHE (default ~/.cache/asynct) python-gguf/
(scripts/fetch_smollm2.sh) and python/ (scripts/fetch_text_assets.sh), or installed.
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402


def load_safetensors(path, np, dtype):
    """name -> array of `dtype` (float32 or float64: exact either way), for BF16, F16 and F32 tensors."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "BF16":
            values = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in ("F16", "F32"):
            values = np.frombuffer(raw, dtype=np.float16 if info["dtype"] == "F16" else np.float32).astype(np.float32)
        else:
            sys.exit(f"{path}: tensor {name} has dtype {info['dtype']} (this reference reads BF16, F16, F32)")
        tensors[name] = values.reshape(info["shape"]).astype(dtype, copy=False)
    return tensors


class Llama:
    def __init__(self, model_dir, np, gguf_qk_order=False, dtype="float32"):
        self.np = np
        self.dtype = np.dtype(dtype)
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        if c.get("rope_scaling"):
            sys.exit(f"{model_dir}/config.json: rope_scaling is not supported by this reference")
        self.layers = c["num_hidden_layers"]
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim", c["hidden_size"] // self.heads)
        self.eps = c["rms_norm_eps"]
        self.w = load_safetensors(os.path.join(model_dir, "model.safetensors"), np, self.dtype)
        if c.get("tie_word_embeddings", False):
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        if gguf_qk_order:
            for i in range(self.layers):
                for proj, n in (("q_proj", self.heads), ("k_proj", self.kv_heads)):
                    name = f"model.layers.{i}.self_attn.{proj}.weight"
                    w = self.w[name]  # llama.cpp's permute(): (head, half, j) -> (head, j, half)
                    self.w[name] = w.reshape(n, 2, self.head_dim // 2, -1).swapaxes(1, 2).reshape(w.shape)
        half = self.head_dim // 2
        self.inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (np.arange(half, dtype=np.float64) * 2 / self.head_dim))

    def rms_norm(self, x, weight):
        np = self.np
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x, positions):
        """Rotate-half RoPE on x [tokens, heads, head_dim]: pairs (x_i, x_{i + head_dim/2})."""
        np = self.np
        angles = positions[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = np.cos(np.concatenate([angles, angles], axis=-1)).astype(self.dtype)[:, None, :]
        sin = np.sin(np.concatenate([angles, angles], axis=-1)).astype(self.dtype)[:, None, :]
        half = self.head_dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def attention(self, q, k, v, positions):
        """q [T, H, d] at `positions`; k, v [S, KV, d] for positions 0..S-1; causal."""
        np = self.np
        group = self.heads // self.kv_heads
        k = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / self.dtype.type(np.sqrt(self.head_dim))
        future = np.arange(k.shape[0])[None, :] > positions[:, None]
        scores = np.where(future[None], -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        return np.einsum("hts,shd->thd", scores, v)

    def forward(self, ids, cache, all_rows=False):
        """Logits [vocab] after the last of `ids` (all_rows: [len(ids), vocab], after each), which follow the
        cache's tokens; appends to the cache."""
        np, w = self.np, self.w
        start = cache[0][0].shape[0] if cache else 0
        positions = np.arange(start, start + len(ids))
        x = w["model.embed_tokens.weight"][ids]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.rms_norm(x, w[p + "input_layernorm.weight"])
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(len(ids), self.heads, self.head_dim)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(len(ids), self.kv_heads, self.head_dim)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(len(ids), self.kv_heads, self.head_dim)
            q, k = self.rope(q, positions), self.rope(k, positions)
            if len(cache) <= i:
                cache.append((k, v))
            else:
                cache[i] = (np.concatenate([cache[i][0], k]), np.concatenate([cache[i][1], v]))
            attn = self.attention(q, cache[i][0], cache[i][1], positions).reshape(len(ids), -1)
            x = x + attn @ w[p + "self_attn.o_proj.weight"].T
            h = self.rms_norm(x, w[p + "post_attention_layernorm.weight"])
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        return self.rms_norm(x if all_rows else x[-1], w["model.norm.weight"]) @ w["lm_head.weight"].T


def add_cache_paths(cache):
    """Makes the packages the fetch scripts put in the cache importable: numpy (python-gguf/),
    tokenizers and jinja2 (python/)."""
    for sub in ("python-gguf", "python"):
        if os.path.isdir(os.path.join(cache, sub)):
            sys.path.insert(0, os.path.join(cache, sub))


def render_chat(model_dir, prompt):
    """The chat template applied as transformers applies it (add_generation_prompt=True)."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    template = env.from_string(tokenizer_config["chat_template"])
    special = {k: tokenizer_config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return template.render(messages=[{"role": "user", "content": prompt}], add_generation_prompt=True, **special)


class GreedyAdapter:
    """golden.greedy_run()'s interface over Llama.forward: logits after a prompt, then after each token."""

    def __init__(self, model):
        self.model, self.cache = model, []

    def start(self, ids):
        self.cache = []
        return self.model.forward(self.model.np.array(ids), self.cache)

    def next(self, token):
        return self.model.forward(self.model.np.array([token]), self.cache)


def write_golden(model, model_dir, tokenizer, path, np):
    eos = golden.eos_token_ids(model_dir)
    records = []
    for text in golden.PROMPTS:
        prompt_ids = tokenizer.encode(render_chat(model_dir, text), add_special_tokens=False).ids
        record, _ = golden.greedy_run(GreedyAdapter(model), text, prompt_ids, eos,
                                      lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        records.append(record)
        print(f"{len(prompt_ids):3} prompt tokens, first EOS at {record['first_eos']}: {record['continuation'][:70]!r}",
              flush=True)
    name = f"tests/model/llama_numpy_reference.py, {model.dtype} (numpy {np.__version__})"
    golden.write_golden(path, golden.golden_document(model_dir, name, records))
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HuggingFace LlamaForCausalLM directory")
    parser.add_argument("--prompt", default="What is the capital of France?", help="the user message")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="precision of every operation (the weights are exact in both)")
    parser.add_argument("--write-golden", metavar="PATH",
                        help="run golden.py's prompts (64 steps through EOS) and write the golden file")
    parser.add_argument("--gguf-qk-order", action="store_true", help="use q/k rows in llama.cpp's order (garbage)")
    parser.add_argument("--cache", default=os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")),
                        help="where python-gguf/ (numpy) and python/ (tokenizers, jinja2) are")
    args = parser.parse_args()
    add_cache_paths(args.cache)
    try:
        import numpy as np
        import tokenizers
        import jinja2  # noqa: F401
    except ImportError as e:
        sys.exit(f"llama_numpy_reference: {e}: run scripts/fetch_smollm2.sh and scripts/fetch_text_assets.sh "
                 f"(or set --cache / ASYNCT_CACHE to their cache)")

    model = Llama(args.model, np, args.gguf_qk_order, args.dtype)
    tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    if args.write_golden:
        write_golden(model, args.model, tokenizer, args.write_golden, np)
        return
    text = render_chat(args.model, args.prompt)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False).ids
    stop = set(golden.eos_token_ids(args.model))
    cache, generated = [], []
    logits = model.forward(np.array(prompt_ids), cache)
    for _ in range(args.max_tokens):
        token = int(np.argmax(logits))  # lowest id on ties
        generated.append(token)
        if token in stop:
            break
        logits = model.forward(np.array([token]), cache)
    print("prompt ids:", " ".join(map(str, prompt_ids)))
    print("generated ids:", " ".join(map(str, generated)))
    print("text:", tokenizer.decode(generated, skip_special_tokens=True))


if __name__ == "__main__":
    main()
