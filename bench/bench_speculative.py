#!/usr/bin/env python3
"""Speculative decoding against none, one request at a time (batch 1), on two workloads: `rewrite`
(the answer repeats its input: code to annotate or rename in, text to correct) and `chat` (plain
questions). Each figure is a workload's generated tokens over its requests' generation time (from
a request's first token to its end, read from `asynct generate --json`; the prompt's prefill is
left out), the best of --rounds rounds, the methods taking turns within a round so that a busy
moment does not favour one. Greedy outputs must be identical with and without speculation: a
difference is an error, unless --allow-divergence (a GPU's products may round a verification
row otherwise than a one-row step at a near tie): then the first differing token is reported.

    python3 bench/bench_speculative.py --build build/cpu --model DIR [--device cpu] [--rounds 3]
        [--methods ngram,suffix[,draft --draft-model DIR]] [--tokens 4] [--max-tokens 256] [--serve]
        [--out FILE.json]

Each request is its own `asynct generate` process, which pays for what a fresh engine does once
(loading kernels, capturing CUDA graphs: more shapes with drafts). --serve measures a warm engine
instead: one `asynct serve` a method, a warm-up pass of other prompts first (untimed), then the
prompts one at a time through /v1/chat/completions (streamed; a request's time from its first
token to its last), drafted and kept tokens read from /metrics. A server's suffix decoding also
drafts from its earlier requests (the warm-up's and the workload's own, in order).

On the CPU the run (SmolLM2-135M-Instruct, 2 rounds) takes about two minutes.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time

CODE = '''def merge_sorted(a, b):
    result = []
    i = 0
    j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result'''

C_CODE = '''int count_words(const char *text) {
    int count = 0;
    int in_word = 0;
    for (const char *p = text; *p != '\\0'; p++) {
        if (*p == ' ' || *p == '\\n' || *p == '\\t') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            count++;
        }
    }
    return count;
}'''

TEXT = ("The lighthouse stood on the edge of the cliff for more then a hundred years. Every night its "
        "keeper climbed the narow stairs to light the lamp, and every morning he wrote the weather in "
        "a small book. Ships that passed the coast new the light and trusted it to guide them home "
        "safely through the storms of winter.")

WORKLOADS = {
    "rewrite": [
        "Rewrite this Python function with type hints, changing nothing else:\n\n" + CODE,
        "Rename the variable `count` to `words` in this C function and show the whole function:\n\n" + C_CODE,
        "Correct the spelling mistakes in this paragraph and write it out again:\n\n" + TEXT,
        "Add a docstring to this Python function and show the whole function:\n\n" + CODE,
    ],
    "chat": [
        "What are three tips for staying healthy?",
        "Write a short poem about the sea.",
        "Explain what a hash table is to a beginner.",
        "Why do leaves change colour in autumn?",
    ],
}


def method_options(args, method):
    """The speculative options of one method on generate's and serve's command lines."""
    options = ["--speculative", method, "--speculative-tokens", str(args.tokens)]
    return options + (["--draft-model", args.draft_model] if method == "draft" else [])


def generate(args, prompt, method):
    """(token ids, generated tokens, seconds of generation) of one request."""
    cmd = [os.path.join(args.build, "src", "asynct"), "generate", "--model", args.model, "--chat", "--prompt", prompt,
           "--max-tokens", str(args.max_tokens), "--device", args.device, "--json"] + method_options(args, method)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_speculative: {' '.join(cmd[:3])} ... failed:\n{done.stderr}")
    line = json.loads(done.stdout.strip().splitlines()[-1])
    drafted = kept = 0
    for info in done.stderr.splitlines():
        if info.startswith("speculative:"):
            words = info.split()
            drafted, kept = int(words[1]), int(words[4])
    tokens = line["token_ids"]
    return tokens, len(tokens) - 1, line["end_s"] - line["first_token_s"], drafted, kept


# Warm-up requests for --serve: other texts, the same kinds of answer (code, prose), so that the
# engine has met the step shapes of a few hundred tokens with drafts of every length.
WARMUP = [
    "Rewrite this Python function with a docstring, changing nothing else:\n\ndef mean(xs):\n    total = 0\n"
    "    for x in xs:\n        total += x\n    return total / len(xs)",
    "Write a short story about a lost key, in about two hundred words.",
]


class Server:
    """`asynct serve` for one method, on a free port, stopped on exit."""

    def __init__(self, args, method):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        cmd = [os.path.join(args.build, "src", "asynct"), "serve", "--model", args.model, "--device", args.device,
               "--port", str(self.port)] + method_options(args, method)
        self.log = open(os.devnull, "w")
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.process.poll() is not None:
                sys.exit(f"bench_speculative: {' '.join(cmd)} exited with {self.process.returncode}")
            try:
                if self.get("/health")[0] == 200:
                    self.model = json.loads(self.get("/v1/models")[1])["data"][0]["id"]
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        sys.exit("bench_speculative: the server did not answer /health within 300 s")

    def get(self, path):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()

    def counters(self):
        """(drafted, kept) so far, from /metrics."""
        values = {}
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith("asynct_spec_") and " " in line and "{" not in line:
                name, value = line.rsplit(" ", 1)
                values[name] = int(float(value))
        return values.get("asynct_spec_drafted_tokens_total", 0), values.get("asynct_spec_accepted_tokens_total", 0)

    def chat(self, prompt, max_tokens):
        """(token count, seconds from the first token to the last, text) of one streamed greedy request."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            sys.exit(f"bench_speculative: the server answered {response.status}: {response.read().decode()[:400]}")
        first = last = None
        count, text = 0, []
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(choice["delta"]["content"])
        if first is None or count < 2:
            sys.exit("bench_speculative: a request generated fewer than two tokens")
        return count, last - first, "".join(text)

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def serve_round(args, method, workloads):
    """{(workload, i): (tokens generated, seconds, text, drafted, kept)} for one method, warm."""
    server = Server(args, method)
    try:
        for prompt in WARMUP:
            server.chat(prompt, args.max_tokens)
        results = {}
        for workload, prompts in workloads.items():
            for i, prompt in enumerate(prompts):
                before = server.counters()
                count, seconds, text = server.chat(prompt, args.max_tokens)
                after = server.counters()
                # (tokens after the first over the time after it: as generate's figures)
                results[(workload, i)] = (count - 1, seconds, text, after[0] - before[0], after[1] - before[1])
        return results
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", required=True, help="build directory (its src/asynct)")
    p.add_argument("--model", required=True, help="checkpoint directory with a tokenizer and chat template")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--methods", default="ngram,suffix", help="comma-separated, beside none")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of " + ", ".join(WORKLOADS))
    p.add_argument("--draft-model", help="the draft checkpoint of the `draft` method (bench/layer_draft.py cuts one from the model)")
    p.add_argument("--tokens", type=int, default=4, help="--speculative-tokens")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--allow-divergence", action="store_true", help="report greedy outputs that differ instead of failing")
    p.add_argument("--serve", action="store_true", help="a warm `asynct serve` a method instead of a process a request")
    args = p.parse_args()
    if args.rounds < 1 or args.tokens < 1 or args.max_tokens < 2:
        sys.exit("bench_speculative: --rounds and --tokens must be >= 1, --max-tokens >= 2")
    methods = ["none"] + [m for m in args.methods.split(",") if m and m != "none"]
    if ("draft" in methods) != bool(args.draft_model):
        sys.exit("bench_speculative: the draft method and --draft-model DIR go together")
    workloads = {w: WORKLOADS[w] for w in args.workloads.split(",") if w}
    if not workloads or len(workloads) != len([w for w in args.workloads.split(",") if w]):
        sys.exit(f"bench_speculative: --workloads takes some of {', '.join(WORKLOADS)}")

    unit = "character" if args.serve else "token"  # what outputs are compared by (a server's text; generate's ids)
    # best[(workload, prompt index, method)] = seconds; the token counts do not change between rounds.
    best, generated, outputs, drafts, diverged = {}, {}, {}, {}, {}
    for r in range(args.rounds):
        # --serve: each method's server answers the round's requests in turn (the methods take
        # turns by round, not by request).
        served = {method: serve_round(args, method, workloads) for method in methods} if args.serve else {}
        for workload, prompts in workloads.items():
            for i, prompt in enumerate(prompts):
                for method in methods:
                    if args.serve:
                        count, seconds, tokens, drafted, kept = served[method][(workload, i)]  # (its text: compared as tokens are)
                    else:
                        tokens, count, seconds, drafted, kept = generate(args, prompt, method)
                    key = (workload, i, method)
                    best[key] = min(best.get(key, seconds), seconds)
                    generated[key], drafts[key] = count, (drafted, kept)
                    base = outputs.setdefault((workload, i), tokens)
                    if tokens != base:
                        first = next((k for k in range(min(len(tokens), len(base))) if tokens[k] != base[k]), min(len(tokens), len(base)))
                        if not args.allow_divergence:
                            sys.exit(f"bench_speculative: {workload} prompt {i}: --speculative {method} generated other tokens "
                                     f"than none from {unit} {first} (greedy outputs must be identical)")
                        diverged[key] = first
                print(f"round {r + 1}/{args.rounds}: {workload} prompt {i + 1}/{len(prompts)} "
                      + ", ".join(f"{m} {generated[(workload, i, m)] / best[(workload, i, m)]:.1f}" for m in methods)
                      + " tokens/s", file=sys.stderr, flush=True)

    figures = {}
    print(f"| workload | method | generated tokens/s | x none | drafts kept | tokens |")
    print(f"|---|---|---|---|---|---|")
    for workload, prompts in workloads.items():
        for method in methods:
            keys = [(workload, i, method) for i in range(len(prompts))]
            rate = sum(generated[k] for k in keys) / sum(best[k] for k in keys)
            drafted = sum(drafts[k][0] for k in keys)
            kept = sum(drafts[k][1] for k in keys)
            figures.setdefault(workload, {})[method] = {"tokens_per_s": rate, "drafted": drafted, "kept": kept,
                                                       "generated": sum(generated[k] for k in keys)}
            ratio = rate / figures[workload]["none"]["tokens_per_s"]
            share = f"{100.0 * kept / drafted:.0f}%" if drafted else "-"
            print(f"| {workload} | {method} | {rate:.1f} | {ratio:.2f}x | {share} | {figures[workload][method]['generated']} |")
    for (workload, i, method), first in sorted(diverged.items()):
        print(f"{workload} prompt {i + 1}, {method}: the text differs from none's from {unit} {first}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "device": args.device, "serve": args.serve, "speculative_tokens": args.tokens,
                       "max_tokens": args.max_tokens, "rounds": args.rounds, "prompts": workloads,
                       "diverged": {f"{w} {i} {m}": first for (w, i, m), first in diverged.items()},
                       "figures": figures}, f, indent=1)


if __name__ == "__main__":
    main()
