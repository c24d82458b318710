"""Encode throughput of asynct's tokenizer beside HuggingFace tokenizers, one core each, same
machine, same text (a benchmark, not a test).

The text is the golden test's mixed corpus (tests/text/golden_corpus.py: many scripts, code,
emoji, whitespace, special tokens, seeded random text) repeated to --megabytes, encoded two
ways: as one text, and as documents of about 64 KB. Each side's best of --repeat passes is
reported in MB/s (10^6 bytes of UTF-8 input per second), with a checksum of the ids so both are
known to produce the same tokens. The process is pinned to one CPU; HF runs with
RAYON_NUM_THREADS=1.

    python3 bench/bench_tokenizer.py --binary build/cpu/bench/asynct_bench_tokenizer \
        [--cache ~/.cache/asynct] [--tokenizer FILE] [--megabytes 4] [--repeat 3]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "text"))
import golden_corpus  # noqa: E402


def checksum(id_lists):
    h = 1469598103934665603
    count = 0
    for ids in id_lists:
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        count += len(ids)
    return h, count


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="asynct_bench_tokenizer")
    parser.add_argument("--cache", default=os.environ.get("ASYNCT_CACHE", os.path.expanduser("~/.cache/asynct")))
    parser.add_argument("--tokenizer", help="tokenizer.json (default: the cache's Qwen3 file)")
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to pin to")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.sched_setaffinity(0, {args.cpu})
    sys.path.insert(0, os.path.join(args.cache, "python"))
    import tokenizers
    path = args.tokenizer or os.path.join(args.cache, "qwen3", "tokenizer.json")
    reference = tokenizers.Tokenizer.from_file(path)

    unit = "\n".join(golden_corpus.corpus())
    target = int(args.megabytes * 1e6)
    text = unit * max(1, target // len(unit.encode()))
    docs, chunk = [], []
    size = 0
    for line in text.splitlines(keepends=True):
        chunk.append(line)
        size += len(line.encode())
        if size >= 65536:
            docs.append("".join(chunk))
            chunk, size = [], 0
    if chunk:
        docs.append("".join(chunk))
    print(f"tokenizer {path}\ntext: {len(text.encode()) / 1e6:.2f} MB (the golden corpus x "
          f"{len(text) // len(unit)}), as one text and as {len(docs)} documents; best of {args.repeat}; one core")

    with tempfile.TemporaryDirectory() as tmp:
        for name, batch in (("one text", [text]), ("64 KB documents", docs)):
            doc_path = os.path.join(tmp, "docs.json")
            with open(doc_path, "w", encoding="utf-8") as f:
                json.dump(batch, f)
            ours = json.loads(subprocess.run([args.binary, path, doc_path, str(args.repeat)], check=True,
                                             capture_output=True, text=True).stdout)
            best, hf_ids = 1e30, None
            for _ in range(args.repeat):
                start = time.perf_counter()
                hf_ids = [reference.encode(d).ids for d in batch]
                best = min(best, time.perf_counter() - start)
            hf_sum, hf_count = checksum(hf_ids)
            same = hf_sum == ours["checksum"] and hf_count == ours["ids"]
            mb = ours["bytes"] / 1e6
            print(f"{name:16s} asynct {mb / ours['seconds']:7.1f} MB/s   HF tokenizers {mb / best:7.1f} MB/s   "
                  f"ratio {best / ours['seconds']:5.2f}x   ids {ours['ids']} {'identical' if same else 'DIFFER'}")
            if not same:
                sys.exit("the ids differ from HuggingFace tokenizers'")


if __name__ == "__main__":
    main()
