#!/usr/bin/env python3
"""Converts a llama-architecture GGUF file into a HuggingFace LlamaForCausalLM directory.

    python3 scripts/gguf_to_hf.py MODEL.gguf OUT_DIR

OUT_DIR (created; it must not exist or be empty) receives:
  config.json             LlamaForCausalLM, from the GGUF's llama.* metadata
  model.safetensors       every weight dequantised to float32, then rounded to bf16 (nearest even)
  tokenizer.json          byte-level BPE from tokenizer.ggml.* (GPT-2-style vocabularies only)
  tokenizer_config.json   chat template and the special tokens
  generation_config.json  bos / eos / pad ids

llama.cpp's HF->GGUF converter permutes the rows of q_proj and k_proj within each head so that
GGML's RoPE, which rotates adjacent pairs (x0, x1), (x2, x3), ..., equals HuggingFace's, which
rotates the two halves (x_i, x_{i + head_dim/2}). unpermute_rope_rows undoes it: the result is
what transformers' LlamaForCausalLM (rotate-half RoPE) expects.

Needs numpy and the `gguf` package (PyPI gguf 0.19.0): scripts/fetch_smollm2.sh installs them
into a cache and runs this. Anything the converter does not handle (another architecture or
tokenizer model, RoPE scaling, an unknown tensor) is an error naming it.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import gguf
except ImportError as e:
    sys.exit(f"gguf_to_hf: {e}: this needs numpy and PyPI's gguf (scripts/fetch_smollm2.sh installs them)")

# The tokenizer.ggml.pre values this converter knows, and the HuggingFace pre-tokenizers they
# stand for (llama.cpp picks the value from the HF tokenizer it converted).
PRE_TOKENIZER_STEPS = {
    # SmolLM / SmolLM2 (StarCoder's vocabulary): every digit on its own, then GPT-2's split.
    "smollm": [{"type": "Digits", "individual_digits": True}],
    "gpt-2": [],
}

# GGUF per-layer tensor names -> HuggingFace's (within model.layers.N).
LAYER_TENSORS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


class ConversionError(Exception):
    pass


def require(condition, message):
    if not condition:
        raise ConversionError(message)


class Metadata:
    """The GGUF's key/value fields, read by name with clear errors."""

    def __init__(self, reader):
        self.fields = reader.fields

    def has(self, key):
        return key in self.fields

    def get(self, key, default=None):
        if key not in self.fields:
            require(default is not None, f"the GGUF has no '{key}'")
            return default
        return self.fields[key].contents()


def unpermute_rope_rows(weight, n_heads):
    """Inverse of llama.cpp's permute(): rows (head, pair j, member i) -> (head, half i, j)."""
    rows = weight.shape[0]
    require(rows % (2 * n_heads) == 0, f"{rows} rows do not split into {n_heads} heads of even size")
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def float32_to_bf16_bits(values, name):
    """Round-to-nearest-even of float32 to bf16, as uint16 bit patterns."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    require(bool(np.isfinite(values).all()), f"tensor {name} has non-finite values")
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def shortest_float32(x):
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def read_config(meta, tensor_names):
    arch = meta.get("general.architecture")
    require(arch == "llama", f"general.architecture is '{arch}'; this converter handles 'llama' only")
    for key in ("llama.rope.scaling.type", "llama.rope.scaling.factor"):
        if meta.has(key):
            value = meta.get(key)
            require(value in ("none", 1.0), f"{key} = {value!r}: RoPE scaling is not supported")
    hidden = int(meta.get("llama.embedding_length"))
    heads = int(meta.get("llama.attention.head_count"))
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    require(hidden % heads == 0 or meta.has("llama.attention.key_length"),
            f"embedding_length {hidden} is not a multiple of head_count {heads}")
    head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
    value_dim = int(meta.get("llama.attention.value_length", head_dim))
    require(value_dim == head_dim, f"attention.value_length {value_dim} differs from key_length {head_dim}")
    rope_dims = int(meta.get("llama.rope.dimension_count", head_dim))
    require(rope_dims == head_dim, f"rope.dimension_count {rope_dims} differs from head_dim {head_dim}: "
            "partial rotary embeddings are not supported")
    require(heads % kv_heads == 0, f"head_count {heads} is not a multiple of head_count_kv {kv_heads}")
    vocab = len(meta.fields["tokenizer.ggml.tokens"].data)
    if meta.has("llama.vocab_size"):
        require(int(meta.get("llama.vocab_size")) == vocab,
                f"llama.vocab_size {meta.get('llama.vocab_size')} differs from the {vocab} tokenizer tokens")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(meta.get("llama.feed_forward_length")),
        "num_hidden_layers": int(meta.get("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": shortest_float32(meta.get("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": shortest_float32(meta.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": int(meta.get("llama.context_length")),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        if meta.has(f"tokenizer.ggml.{field}"):
            config[key] = int(meta.get(f"tokenizer.ggml.{field}"))
    return config


def expected_shapes(config):
    """HuggingFace name -> shape [out, in] for every weight the config implies."""
    h, f, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": [config["vocab_size"], h], "model.norm.weight": [h]}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [config["vocab_size"], h]
    per_layer = {"self_attn.q_proj.weight": [q, h], "self_attn.k_proj.weight": [kv, h],
                 "self_attn.v_proj.weight": [kv, h], "self_attn.o_proj.weight": [h, q],
                 "mlp.gate_proj.weight": [f, h], "mlp.up_proj.weight": [f, h], "mlp.down_proj.weight": [h, f],
                 "input_layernorm.weight": [h], "post_attention_layernorm.weight": [h]}
    for layer in range(config["num_hidden_layers"]):
        for name, shape in per_layer.items():
            shapes[f"model.layers.{layer}.{name}"] = shape
    return shapes


def hf_name(gguf_name, num_layers):
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        layer = int(parts[1])
        require(layer < num_layers, f"tensor {gguf_name}: layer {layer} is past block_count {num_layers}")
        return f"model.layers.{layer}.{LAYER_TENSORS[parts[2]]}"
    raise ConversionError(f"tensor '{gguf_name}' has no LlamaForCausalLM counterpart")


def dequantised(tensor, config, name):
    """The tensor as float32 [out, in] (GGUF lists dimensions innermost first), q/k un-permuted."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = [int(n) for n in reversed(tensor.shape)]
    values = np.asarray(values, dtype=np.float32).reshape(shape)
    if name.endswith("q_proj.weight"):
        values = unpermute_rope_rows(values, config["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
        values = unpermute_rope_rows(values, config["num_key_value_heads"])
    return values


def write_safetensors(path, reader, config):
    """Streams the weights into a bf16 safetensors file, one tensor at a time."""
    shapes = expected_shapes(config)
    by_name = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name, config["num_hidden_layers"])
        require(name not in by_name, f"tensor {name} appears twice")
        shape = [int(n) for n in reversed(tensor.shape)]
        require(name in shapes, f"tensor {tensor.name} ({name}) is not expected by the config")
        require(shape == shapes[name], f"tensor {tensor.name} ({name}) has shape {shape}, expected {shapes[name]}")
        by_name[name] = tensor
    missing = sorted(set(shapes) - set(by_name))
    require(not missing, f"the GGUF lacks {len(missing)} tensors, e.g. {missing[:3]}")

    names = sorted(by_name)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        size = int(np.prod(shapes[name])) * 2
        header[name] = {"dtype": "BF16", "shape": shapes[name], "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(header_bytes)))
        out.write(header_bytes)
        for name in names:
            out.write(float32_to_bf16_bits(dequantised(by_name[name], config, name), name).tobytes())


def tokenizer_files(meta, config):
    """(tokenizer.json, tokenizer_config.json) as dicts, from tokenizer.ggml.*."""
    model = meta.get("tokenizer.ggml.model")
    require(model == "gpt2", f"tokenizer.ggml.model is '{model}'; this converter handles byte-level BPE ('gpt2') only")
    pre = meta.get("tokenizer.ggml.pre", "gpt-2")
    require(pre in PRE_TOKENIZER_STEPS,
            f"tokenizer.ggml.pre is '{pre}'; this converter knows {sorted(PRE_TOKENIZER_STEPS)}")
    require(not meta.get("tokenizer.ggml.add_bos_token", False),
            "tokenizer.ggml.add_bos_token is true: this converter writes no post-processor that adds it")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    merges = meta.get("tokenizer.ggml.merges")
    require(len(types) == len(tokens), f"{len(types)} token types for {len(tokens)} tokens")
    require(len(set(tokens)) == len(tokens), "tokenizer.ggml.tokens has duplicates")
    for merge in merges:
        require(merge.count(" ") == 1, f"the merge {merge!r} is not two tokens separated by one space")

    added = []
    for token_id, (content, kind) in enumerate(zip(tokens, types)):
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            special = kind == TOKEN_TYPE_CONTROL
            added.append({"id": token_id, "content": content, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": not special, "special": special})
    add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    byte_level = {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": True}
    steps = PRE_TOKENIZER_STEPS[pre] + [byte_level]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {token: i for i, token in enumerate(tokens)}, "merges": merges},
    }

    def token_text(field):
        key = f"tokenizer.ggml.{field}"
        if not meta.has(key):
            return None
        token_id = int(meta.get(key))
        require(0 <= token_id < len(tokens), f"{key} {token_id} is outside the {len(tokens)} tokens")
        return tokens[token_id]

    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": add_prefix_space,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "bos_token": token_text("bos_token_id"),
        "eos_token": token_text("eos_token_id"),
        "pad_token": token_text("padding_token_id"),
        "unk_token": token_text("unknown_token_id"),
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
    }
    if meta.has("tokenizer.chat_template"):
        tokenizer_config["chat_template"] = meta.get("tokenizer.chat_template")
    return tokenizer, tokenizer_config


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def convert(gguf_path, out_dir):
    try:
        reader = gguf.GGUFReader(gguf_path)
    except Exception as e:  # the reader reports a short or malformed file in many ways
        raise ConversionError(f"not a readable GGUF file ({type(e).__name__}: {e})")
    meta = Metadata(reader)
    config = read_config(meta, {t.name for t in reader.tensors})
    tokenizer, tokenizer_config = tokenizer_files(meta, config)
    generation_config = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    os.makedirs(out_dir, exist_ok=True)
    require(not os.listdir(out_dir), f"the output directory {out_dir} is not empty")
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), generation_config)
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)  # one line, as HuggingFace writes it
    write_safetensors(os.path.join(out_dir, "model.safetensors"), reader, config)


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    if not os.path.isfile(gguf_path):
        sys.exit(f"gguf_to_hf: {gguf_path} is not a file")
    try:
        convert(gguf_path, out_dir)
    except (ConversionError, ValueError, KeyError) as e:
        sys.exit(f"gguf_to_hf: {gguf_path}: {e}")


if __name__ == "__main__":
    main()
