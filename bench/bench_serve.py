#!/usr/bin/env python3
"""A serving benchmark in the manner of vLLM's benchmark_serving, against any OpenAI-compatible
server (`asynct serve`): random prompts of a given length as token ids, a fixed number of
output tokens each (ignore_eos), sent at a fixed concurrency or a Poisson request rate, every
response streamed. Reports request and token throughput and TTFT, TPOT, inter-token and
end-to-end latency at p50 / p90 / p99, as a table and (with --json) JSON.

    asynct serve --model DIR --max-model-len 1280 --max-cache-mib 16384 &
    python3 bench/bench_serve.py --url http://127.0.0.1:8000/v1 --input-len 1024 --output-len 256 \\
        --num-prompts 256 --concurrency 64 --json out.json

The same load in process is `asynct bench --scenario serve_load_c64`: its output tokens a second
are the anchor for the HTTP figure. --shared-prefix-len N starts every prompt with the same N
tokens (a system prompt): with prefix caching the first request computes them and the rest
find them cached; `--concurrency 1` then shows the first request's TTFT against the others'. Plain
Python (http.client in threads, spread over --workers processes: no client library between the
clock and the socket). TTFT is the first chunk with text; inter-token latency is
between chunks (a token that ends inside a UTF-8 character arrives with the next one).
Where the server has asynct's /metrics, the run's server-side figures are printed beside the
client's: its TTFT (submission to the first token's sampling), its engine steps' host time and
the engine thread's gaps between steps (means over the run).
"""
import argparse
import http.client
import itertools
import json
import multiprocessing
import os
import random
import statistics
import threading
import time
import urllib.parse


# --response-format's constraints: any JSON object, or objects of this schema (a long free string
# field and a bounded list, so a constrained answer runs for many tokens).
RESPONSE_FORMATS = {
    "none": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "record", "strict": True, "schema": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                       "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 8},
                       "summary": {"type": "string"}},
        "required": ["title", "year", "tags", "summary"], "additionalProperties": False}}},
}


def one_request(url, model, prompt_ids, output_len, timeout, response_format=None):
    """Streams one completion; returns its timings (seconds) and token count, or an error."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    request = {"model": model, "prompt": prompt_ids, "max_tokens": output_len, "ignore_eos": True,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if response_format:
        request["response_format"] = response_format
    body = json.dumps(request)
    start = time.monotonic()
    result = {"start": start, "chunks": [], "tokens": 0, "error": None}
    try:
        connection.request("POST", parts.path.rstrip("/") + "/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            result["error"] = f"HTTP {response.status}: {response.read()[:200]!r}"
            return result
        for line in response:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result["tokens"] = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                result["chunks"].append(time.monotonic())
    except (OSError, http.client.HTTPException, ValueError) as e:
        result["error"] = repr(e)
    finally:
        result["end"] = time.monotonic()
        connection.close()
    return result


def run_share(args, share, concurrency, start):
    """One client process: sends its (prompt, offset) requests at start + offset, at most
    `concurrency` at once, each on a thread; returns their results."""
    slots = threading.Semaphore(concurrency)
    results, lock, threads = [], threading.Lock(), []

    def run(prompt):
        try:
            r = one_request(args.url, args.model, prompt, args.output_len, args.timeout,
                            RESPONSE_FORMATS[args.response_format])
            with lock:
                results.append(r)
        finally:
            slots.release()

    for prompt, offset in share:
        time.sleep(max(0.0, start + offset - time.monotonic()))
        slots.acquire()
        t = threading.Thread(target=run, args=(prompt,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results


def client_processes(args, requests):
    """How many worker processes send `requests` requests: --workers, at most one a request and
    one a slot of the concurrency."""
    return max(1, min(args.workers, args.concurrency, requests))


def run_all(args, prompts, gaps):
    """Sends the prompts, request i at sum(gaps[:i + 1]) seconds after the start (or as soon as a
    slot frees) by worker process i % workers: one Python process reads ~15k chunks a second at
    most, less than a small model streams at 64 requests, so the reading is spread over
    processes, each with its share of the concurrency. Returns the results and the start
    (time.monotonic())."""
    offsets = list(itertools.accumulate(gaps))
    workers = client_processes(args, len(prompts))
    start = time.monotonic() + 0.2 * workers  # time for the processes to start
    jobs = [(args, [(prompts[i], offsets[i]) for i in range(w, len(prompts), workers)],
             args.concurrency // workers + (w < args.concurrency % workers), start) for w in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return [r for part in pool.starmap(run_share, jobs) for r in part], start


def percentiles(values, scale=1000.0):
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale  # noqa: E731
    return {"mean": statistics.fmean(values) * scale, "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


# The histograms of asynct's /metrics whose run means are printed (name, label).
SERVER_HISTOGRAMS = (("asynct_time_to_first_token_seconds", "ttft"), ("asynct_engine_step_seconds", "step"),
                     ("asynct_engine_gap_seconds", "gap between steps"))


def server_sums(url):
    """{histogram: (sum, count)} from the server's /metrics, or None where it has none."""
    parts = urllib.parse.urlsplit(url)
    try:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=10)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        text = response.read().decode()
        if response.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for histogram, _ in SERVER_HISTOGRAMS:
            if name in (histogram + "_sum", histogram + "_count"):
                values[name] = float(value)
    return {h: (values.get(h + "_sum", 0.0), values.get(h + "_count", 0.0)) for h, _ in SERVER_HISTOGRAMS}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="default: the first model /v1/models lists")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests a second, Poisson arrivals (inf: all at once, bounded by --concurrency)")
    parser.add_argument("--token-range", default="1000,10000", help="prompt token ids are drawn from [lo, hi)")
    parser.add_argument("--shared-prefix-len", type=int, default=0,
                        help="the first N prompt tokens are the same in every request (of --input-len)")
    parser.add_argument("--seed", type=int, default=0, help="prompts and arrivals (a new seed: prompts no cache holds)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="client processes the requests are spread over")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for one request")
    parser.add_argument("--warmup-prompts", type=int, default=0,
                        help="first send this many requests of the same shape (their own prompts, their own "
                             "shared prefix) at the same concurrency, unmeasured: a server's first requests "
                             "load kernels and plan its products, which `asynct bench` does in its untimed run")
    parser.add_argument("--response-format", choices=sorted(RESPONSE_FORMATS), default="none",
                        help="constrain every answer (structured output): any JSON object, or a fixed schema")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    for name in ("input_len", "output_len", "num_prompts", "concurrency", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup_prompts < 0:
        parser.error("--warmup-prompts must be >= 0")
    if not args.request_rate > 0:
        parser.error("--request-rate must be > 0")
    lo, hi = (int(x) for x in args.token_range.split(","))

    if not args.model:
        parts = urllib.parse.urlsplit(args.url)
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
        connection.request("GET", parts.path.rstrip("/") + "/models")
        args.model = json.loads(connection.getresponse().read())["data"][0]["id"]
    if not 0 <= args.shared_prefix_len <= args.input_len:
        parser.error("--shared-prefix-len must be in [0, --input-len]")

    def make_prompts(rng, count):
        prefix = [rng.randrange(lo, hi) for _ in range(args.shared_prefix_len)]
        return [prefix + [rng.randrange(lo, hi) for _ in range(args.input_len - len(prefix))] for _ in range(count)]

    if args.warmup_prompts:
        warmup = make_prompts(random.Random(f"warmup {args.seed}"), args.warmup_prompts)
        print(f"bench_serve: warming up with {len(warmup)} requests", flush=True)
        results, _ = run_all(args, warmup, [0.0] * len(warmup))
        failed = [r for r in results if r["error"]]
        if failed:
            raise SystemExit(f"bench_serve: {len(failed)} warm-up requests failed: {failed[0]['error']}")
    rng = random.Random(args.seed)
    prompts = make_prompts(rng, args.num_prompts)
    gaps = [0.0 if args.request_rate == float("inf") else rng.expovariate(args.request_rate) for _ in prompts]

    workers = client_processes(args, args.num_prompts)
    print(f"bench_serve: {args.num_prompts} requests of {args.input_len} prompt / {args.output_len} output tokens to "
          f"{args.url} ({args.model}), concurrency {args.concurrency}, rate {args.request_rate} req/s, "
          f"{workers} client processes", flush=True)
    before = server_sums(args.url)
    results, start = run_all(args, prompts, gaps)
    duration = max(r["end"] for r in results) - start
    after = server_sums(args.url) if before else None

    ok = sorted((r for r in results if not r["error"] and r["chunks"]), key=lambda r: r["start"])
    failed = [r for r in results if r["error"] or not r["chunks"]]
    output_tokens = sum(r["tokens"] for r in ok)
    ttft = [r["chunks"][0] - r["start"] for r in ok]
    e2e = [r["end"] - r["start"] for r in ok]
    tpot = [(r["chunks"][-1] - r["chunks"][0]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    itl = [b - a for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    report = {
        "url": args.url, "model": args.model, "input_len": args.input_len, "output_len": args.output_len,
        "num_prompts": args.num_prompts, "concurrency": args.concurrency, "request_rate": args.request_rate,
        "duration_s": duration, "completed": len(ok), "failed": len(failed),
        "errors": sorted({r["error"] for r in failed if r["error"]})[:5],
        "request_throughput": len(ok) / duration, "output_token_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + len(ok) * args.input_len) / duration,
        "ttft_ms": percentiles(ttft), "tpot_ms": percentiles(tpot), "itl_ms": percentiles(itl), "e2e_ms": percentiles(e2e),
        "shared_prefix_len": args.shared_prefix_len,
        # In submission order: with --concurrency 1 and a shared prefix, the first computes it.
        "ttft_first_ms": (ok[0]["chunks"][0] - ok[0]["start"]) * 1000 if ok else None,
        # Requests in flight on the client's clock, on average over the run (a closed loop that
        # refills at once holds --concurrency); each request's [sent, first text, end] in seconds
        # from the start, and its tokens.
        "in_flight_mean": sum(e2e) / duration if ok else None,
        "requests": [[round(r["start"] - start, 6), round(r["chunks"][0] - start, 6), round(r["end"] - start, 6), r["tokens"]]
                     for r in ok],
    }
    print(f"  completed {len(ok)}, failed {len(failed)} in {duration:.2f} s")
    print(f"  requests {report['request_throughput']:.2f}/s; output tokens {report['output_token_throughput']:.1f}/s; "
          f"all tokens {report['total_token_throughput']:.1f}/s")
    if ok:
        print(f"  requests in flight on average: {report['in_flight_mean']:.1f} (concurrency {args.concurrency})")
    print(f"  {'ms':6} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}")
    for name in ("ttft", "tpot", "itl", "e2e"):
        p = report[name + "_ms"]
        if p["mean"] is not None:
            print(f"  {name:6} {p['mean']:9.2f} {p['p50']:9.2f} {p['p90']:9.2f} {p['p99']:9.2f}")
    if args.shared_prefix_len and ok:
        print(f"  shared prefix of {args.shared_prefix_len} tokens: the first request's TTFT {report['ttft_first_ms']:.2f} ms, "
              f"the others' p50 {percentiles(ttft[1:])['p50'] or 0:.2f} ms")
    if after:
        report["server"] = {}
        parts = []
        for histogram, label in SERVER_HISTOGRAMS:
            total, count = (a - b for a, b in zip(after[histogram], before[histogram]))
            mean_ms = total / count * 1000 if count else None
            report["server"][label] = {"count": count, "mean_ms": mean_ms}
            if mean_ms is not None:
                parts.append(f"{label} {mean_ms:.3f} ms (x{count:.0f})")
        print("  server side, means: " + "; ".join(parts))
    for error in report["errors"]:
        print(f"  error: {error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"  wrote {args.json}")


if __name__ == "__main__":
    main()
