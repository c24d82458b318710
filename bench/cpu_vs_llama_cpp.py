#!/usr/bin/env python3
"""The CPU backend beside llama.cpp in the same run, on the same SmolLM2-135M-Instruct weights:
prompt processing (512 tokens) and generation (128 tokens), bf16 against llama.cpp's BF16 and
asynct's 8-bit weights (--quantization int8, and fp8) against llama.cpp's Q8_0, with the machine's memory
read rate before and after. The two run in turns (llama.cpp, asynct, ...) and each figure is the
best of its rounds, so that a busy moment does not favour either; run it on a quiet machine
(llama.cpp's threads spin at barriers: another busy process halves its generation rate).

Generation is timed at two depths, each the same for both: after a 512-token prompt (asynct's
tokens 513-640; llama-bench's tg128 at `-d 512`) and from an empty cache (asynct after a 1-token
prompt; llama-bench's plain tg128). llama-bench's default tg128 starts from an empty cache, so
it must not be set beside a figure measured after a prompt: attention over 512 more keys is
10-19% of a token here.

    python3 bench/cpu_vs_llama_cpp.py --build build/cpu [--model DIR] [--threads 2] [--rounds 2] [--out FILE]

llama.cpp is built from PyPI's llama-cpp-python sdist by bench/fetch_llama_cpp.sh (once, ~10
minutes); asynct's rates come from bench/cpu_generate_rates.sh.
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = ("prompt", "generated_512", "generated")


def llama_bench(llama_dir, gguf, threads):
    """{"prompt": tokens/s for 512, "generated": for 128 from an empty cache, "generated_512": for 128
    after 512} of one llama-bench call."""
    out = subprocess.run([os.path.join(llama_dir, "bin", "llama-bench"), "-m", gguf, "-p", "512", "-n", "128", "-d",
                          "0,512", "-t", str(threads), "-r", "1", "-o", "csv"], check=True, capture_output=True,
                         text=True, env={**os.environ, "LD_LIBRARY_PATH": os.path.join(llama_dir, "bin")}).stdout
    rates = {}
    for row in csv.DictReader(io.StringIO(out)):
        depth = int(row["n_depth"])
        if int(row["n_prompt"]) > 0 and depth == 0:
            rates["prompt"] = float(row["avg_ts"])
        elif int(row["n_gen"]) > 0:
            rates["generated" if depth == 0 else "generated_512"] = float(row["avg_ts"])
    return rates


def asynct_rates(build, model, threads, options):
    """({"prompt", "generated", "generated_512"} tokens/s as llama_bench's, memory read rates GB/s) of
    two cpu_generate_rates.sh calls: a 512-token prompt, then a 1-token one."""
    rates, reads = {}, []
    for prompt in (512, 1):
        out = subprocess.run(["bash", os.path.join(HERE, "cpu_generate_rates.sh"), build, model, str(prompt), "128", "1",
                              *options], check=True, capture_output=True, text=True,
                             env={**os.environ, "ASYNCT_THREADS": str(threads)}).stdout
        m = re.search(r"prompt [0-9]+: ([0-9.]+) tokens/s.*generated 128: ([0-9.]+) tokens/s", out)
        if not m:
            sys.exit(f"cpu_generate_rates.sh printed no rates:\n{out}")
        if prompt == 512:
            rates["prompt"], rates["generated_512"] = float(m.group(1)), float(m.group(2))
        else:
            rates["generated"] = float(m.group(2))
        reads += [float(x) for x in re.findall(r"([0-9.]+) GB/s", out)]
    return rates, reads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="asynct's build directory (e.g. build/cpu)")
    parser.add_argument("--model", default=os.path.expanduser("~/.cache/asynct/smollm2-135m-instruct"))
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args()

    llama_dir = subprocess.run(["bash", os.path.join(HERE, "fetch_llama_cpp.sh")], check=True, capture_output=True,
                               text=True).stdout.strip()
    pairs = [("bf16", os.path.join(llama_dir, "smollm2-bf16.gguf"), "BF16", []),
             ("int8", os.path.join(llama_dir, "smollm2-q8_0.gguf"), "Q8_0", ["--quantization", "int8"]),
             ("fp8", os.path.join(llama_dir, "smollm2-q8_0.gguf"), "Q8_0", ["--quantization", "fp8"])]
    best = {}
    reads = []
    for r in range(args.rounds):
        for label, gguf, llama_type, options in pairs:
            llama = llama_bench(llama_dir, gguf, args.threads)
            ours, read = asynct_rates(args.build, args.model, args.threads, options)
            reads += read
            print(f"round {r + 1}, {label}: llama.cpp {llama_type} " + " / ".join(f"{llama[f]:.1f}" for f in FIGURES) +
                  "; asynct " + " / ".join(f"{ours[f]:.1f}" for f in FIGURES) + " (" + " / ".join(FIGURES) + " tokens/s)",
                  file=sys.stderr, flush=True)
            for figure in FIGURES:
                best[("llama", label, figure)] = max(best.get(("llama", label, figure), 0.0), llama[figure])
                best[("asynct", label, figure)] = max(best.get(("asynct", label, figure), 0.0), ours[figure])

    lines = [f"asynct CPU backend beside llama.cpp (llama-cpp-python 0.3.36's source), SmolLM2-135M-Instruct, "
             f"{args.threads} threads, best of {args.rounds} alternating rounds; memory read rate "
             f"{min(reads):.1f}-{max(reads):.1f} GB/s during the run",
             "| weights | figure | asynct tokens/s | llama.cpp tokens/s | ratio |", "|---|---|---|---|---|"]
    for label, _, llama_type, options in pairs:
        ours = {"bf16": "bf16", "int8": "int8, 1 x 32 blocks", "fp8": "FP8 e4m3, 1 x 128 blocks"}[label]
        for figure, what in (("prompt", "prompt processing, 512 tokens"),
                             ("generated_512", "generation, 128 tokens after 512"),
                             ("generated", "generation, 128 tokens from an empty cache")):
            a, b = best[("asynct", label, figure)], best[("llama", label, figure)]
            lines.append(f"| {ours} vs {llama_type} | {what} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
