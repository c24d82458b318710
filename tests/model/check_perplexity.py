#!/usr/bin/env python3
"""`asynct perplexity` against the plain-numpy LlamaForCausalLM (CTest model_smollm2_perplexity, CPU).

    python3 tests/model/check_perplexity.py --asynct build/release/src/asynct \\
        --model ~/.cache/asynct/smollm2-135m-instruct [--file /usr/share/common-licenses/GPL-3]

asynct scores the file's first --tokens tokens in windows of --context tokens, cut into steps of
--max-batched-tokens (so that a window's later steps read the earlier ones' cache) and writes
its JSON; the reference (llama_numpy_reference.py, every operation in float64) computes the
same windows from their own definition: window k holds tokens k (C - 1) .. k (C - 1) + C - 1
(the last one what is left), and each token after a window's first is scored by its
log-probability given the tokens before it in the window. The windows' starts and lengths
must be the same, each window's summed negative log-likelihood and the perplexity within
--tolerance (relative).

The token ids are HuggingFace tokenizers' when it is importable (scripts/fetch_text_assets.sh
puts it in the cache), else `asynct tokenize`'s (tested against HuggingFace's elsewhere); either
way they must be as many as asynct counted in the file. The default file is the GPL-3 text
every Debian ships. Skipped (exit 77) without the model (scripts/fetch_smollm2.sh), numpy (the
same script's python-gguf/) or the file.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_numpy_reference as reference  # noqa: E402

SKIP = 77


def token_ids(args, text_path):
    """The file's ids as a plain prompt gets them (SmolLM2 adds no special tokens) and who gave them."""
    try:
        import tokenizers
        tokenizer = tokenizers.Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
        with open(text_path, encoding="utf-8") as f:
            return tokenizer.encode(f.read(), add_special_tokens=False).ids, f"tokenizers {tokenizers.__version__}"
    except ImportError:
        pass
    with open(text_path, "rb") as f:
        out = subprocess.run([args.asynct, "tokenize", "--model", args.model], stdin=f, capture_output=True, check=True)
    return [int(t) for t in out.stdout.split()], "asynct tokenize"


def log_softmax(np, logits):
    top = logits.max(axis=-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asynct", required=True, help="the asynct binary")
    parser.add_argument("--model", required=True, help="a LlamaForCausalLM directory with its tokenizer.json")
    parser.add_argument("--file", default="/usr/share/common-licenses/GPL-3", help="the text")
    parser.add_argument("--tokens", type=int, default=96, help="score the file's first N tokens")
    parser.add_argument("--context", type=int, default=40)
    parser.add_argument("--max-batched-tokens", type=int, default=24)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="relative, on each window's NLL and the perplexity")
    parser.add_argument("--cache", default=os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")),
                        help="where python-gguf/ (numpy) and python/ (tokenizers) are")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.model, "model.safetensors")):
        print(f"SKIPPED: no model at {args.model} (scripts/fetch_smollm2.sh makes it)")
        return SKIP
    if not os.path.isfile(args.file):
        print(f"SKIPPED: no {args.file}")
        return SKIP
    reference.add_cache_paths(args.cache)
    try:
        import numpy as np
    except ImportError:
        print(f"SKIPPED: no numpy (scripts/fetch_smollm2.sh puts one in {args.cache}/python-gguf)")
        return SKIP

    with tempfile.TemporaryDirectory() as tmp:
        json_path = os.path.join(tmp, "ppl.json")
        command = [args.asynct, "perplexity", "--model", args.model, "--file", args.file, "--device", "cpu", "--cpu-reference",
                   "--max-tokens", str(args.tokens), "--context", str(args.context),
                   "--max-batched-tokens", str(args.max_batched_tokens), "--json", json_path]
        start = time.time()
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAIL: {' '.join(command)} exited {run.returncode}\n{run.stdout}{run.stderr}")
            return 1
        with open(json_path) as f:
            got = json.load(f)
    print(f"asynct: {run.stdout.strip()} ({time.time() - start:.1f} s)")

    ids, source = token_ids(args, args.file)
    failures = []
    if len(ids) != got["file_tokens"]:
        failures.append(f"{source} gives {len(ids)} tokens for {args.file}, asynct {got['file_tokens']}")
    ids = ids[: args.tokens]
    n, c = len(ids), args.context
    starts = list(range(0, n - 1, c - 1))
    windows = [(s, min(c, n - s)) for s in starts]
    got_windows = [(w["start"], w["tokens"]) for w in got["window_results"]]
    if got_windows != windows:
        failures.append(f"windows (start, tokens): asynct {got_windows}, expected {windows}")
    if got["scored_tokens"] != n - 1:
        failures.append(f"asynct scored {got['scored_tokens']} tokens, expected {n - 1}")

    start = time.time()
    model = reference.Llama(args.model, np, dtype="float64")
    total = 0.0
    for k, (s, length) in enumerate(windows):
        window = np.array(ids[s: s + length])
        logprobs = log_softmax(np, model.forward(window[:-1], [], all_rows=True))  # row i predicts token i + 1
        nll = -float(logprobs[np.arange(length - 1), window[1:]].sum())
        total += nll
        if k < len(got["window_results"]):
            asynct_nll = got["window_results"][k]["nll_sum"]
            error = abs(asynct_nll - nll) / abs(nll)
            print(f"window {k}: tokens {s}..{s + length - 1}, NLL asynct {asynct_nll:.6f}, reference {nll:.6f}, "
                  f"relative error {error:.2e}")
            if not error <= args.tolerance:
                failures.append(f"window {k}: NLL {asynct_nll} against the reference's {nll}")
    perplexity = float(np.exp(total / (n - 1)))
    error = abs(got["perplexity"] - perplexity) / perplexity
    print(f"perplexity over {n - 1} tokens ({source}'s ids): asynct {got['perplexity']:.6f}, reference (numpy float64) "
          f"{perplexity:.6f}, relative error {error:.2e} ({time.time() - start:.1f} s)")
    if not error <= args.tolerance:
        failures.append(f"perplexity {got['perplexity']} against the reference's {perplexity}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
