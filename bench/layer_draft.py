#!/usr/bin/env python3
"""Writes a draft model for `--speculative draft` cut from a checkpoint: its first N decoder
layers, then its own final norm and LM head (an early exit, as self-speculative decoding and
LayerSkip draft). The draft shares the model's tokenizer and weights bit for bit, so it needs no
other download: the benches time the draft-model method with it where no smaller checkpoint of
the same tokenizer is at hand. Pure Python (the safetensors header is JSON; tensors are copied as
bytes).

    python3 bench/layer_draft.py --model DIR --layers N --out DIR
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def read_header(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(size)), 8 + size


def cut(model_dir, layers, out_dir):
    config_path = os.path.join(model_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or not 1 <= layers < total:
        sys.exit(f"layer_draft: --layers must be in 1..{total - 1 if isinstance(total, int) else '?'} for {config_path}")
    shards = sorted(name for name in os.listdir(model_dir) if name.endswith(".safetensors"))
    if not shards:
        sys.exit(f"layer_draft: no .safetensors file in {model_dir}")
    os.makedirs(out_dir, exist_ok=True)
    kept_tensors = 0
    for shard in shards:
        header, data_start = read_header(os.path.join(model_dir, shard))
        kept = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            m = LAYER.match(name)
            if m is None or int(m.group(1)) < layers:
                kept[name] = info
        # The kept tensors packed in their old order, offsets renumbered.
        order = sorted(kept, key=lambda n: kept[n]["data_offsets"][0])
        offset = 0
        new_header = {"__metadata__": header.get("__metadata__", {"format": "pt"})}
        for name in order:
            begin, end = kept[name]["data_offsets"]
            new_header[name] = {"dtype": kept[name]["dtype"], "shape": kept[name]["shape"],
                                "data_offsets": [offset, offset + end - begin]}
            offset += end - begin
        encoded = json.dumps(new_header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        with open(os.path.join(model_dir, shard), "rb") as src, open(os.path.join(out_dir, shard), "wb") as dst:
            dst.write(struct.pack("<Q", len(encoded)))
            dst.write(encoded)
            for name in order:
                begin, end = kept[name]["data_offsets"]
                src.seek(data_start + begin)
                dst.write(src.read(end - begin))
        kept_tensors += len(order)
    config["num_hidden_layers"] = layers
    for key in ("layer_types", "max_window_layers"):  # per-layer lists a shorter model must match
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    for name in os.listdir(model_dir):
        if name.endswith((".safetensors", ".index.json")) or name == "config.json":
            continue
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            shutil.copy(path, os.path.join(out_dir, name))
    return kept_tensors, total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, *.safetensors, tokenizer)")
    p.add_argument("--layers", type=int, required=True, help="decoder layers the draft keeps")
    p.add_argument("--out", required=True, help="directory to write the draft into")
    args = p.parse_args()
    if os.path.exists(os.path.join(args.model, "model.safetensors.index.json")):
        sys.exit("layer_draft: sharded checkpoints (model.safetensors.index.json) are not handled")
    kept, total = cut(args.model, args.layers, args.out)
    print(f"layer_draft: {args.out}: layers 0..{args.layers - 1} of {total}, {kept} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
