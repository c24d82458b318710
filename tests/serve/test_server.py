#!/usr/bin/env python3
"""`asynct serve` through the OpenAI Python client (and raw HTTP for what a client library
would not send), on 127.0.0.1, against `asynct generate` on the same model.

    python3 tests/serve/test_server.py --asynct build/release/src/asynct \\
        --tokenizer-from ~/.cache/asynct/smollm2-135m-instruct --client ~/.cache/asynct/python-openai

The model: a tiny random LlamaForCausalLM written here (2 layers, hidden 64) with SmolLM2's
tokenizer files and chat template, so that requests take milliseconds even under a sanitizer.
Checked:
- completions and chat, streamed and not: the same text as `asynct generate` for the same
  prompt (greedy, and seeded sampling), usage counts, finish reasons, stop strings;
- 32 concurrent streams, 8 closed mid-stream: every finished one complete and equal to its
  request alone, the server alive after; a whole response's client that leaves ends its request;
- structured output (with --jsonschema, for a build with xgrammar): json_schema outputs validate,
  json_object outputs parse (structured_checks.py); forced tool calls validate, whole and streamed,
  and go back with their results, through SmolLM2's template and (--qwen3-tokenizer) Qwen3's
  (tool_checks.py);
- logit_bias: -100 on the greedy first token changes it, +100 forces a token (logprobs unbiased);
- seedless sampling differs from request to request, seeded sampling repeats;
- lists of prompts, models.retrieve, /tokenize and /detokenize, system_fingerprint;
- bad requests, each with its status and OpenAI's error object (unimplemented fields included);
  405 with Allow for a known route's other methods, 404 for unknown routes;
- 429 past the queue bound, 413 past the body limit (chunked or not, the connection closed);
- a second server with --api-key and --allowed-origins: 401s, open routes, X-Request-Id, the
  access log, CORS preflights;
- SIGTERM: /health turns 503, an open stream ends with finish_reason "abort" and [DONE], the
  server exits 0.
(Over 500 lines: every check shares the one server, its model and its client, started once.)
Every request has a timeout; every server started is stopped. Exit 77 (skipped) without the
client or the tokenizer files.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time

from server_harness import TIMEOUT, Checks, Server, generate, raw, upload, write_tiny_llama
from structured_checks import check_structured_output
from tool_checks import check_qwen3_tool_calls, check_tool_calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asynct", required=True)
    parser.add_argument("--tokenizer-from", required=True, help="a directory with tokenizer.json and a chat template")
    parser.add_argument("--client", required=True, help="where the openai package is (scripts/fetch_client_assets.sh)")
    parser.add_argument("--jsonschema", help="where the jsonschema package is (scripts/fetch_grammar_assets.sh): "
                                             "checks structured output, which needs a build with xgrammar")
    parser.add_argument("--qwen3-tokenizer", help="Qwen3's tokenizer files (scripts/fetch_text_assets.sh): with --jsonschema, "
                                                  "tool calls through a template that renders tools itself")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(args.tokenizer_from, "tokenizer.json")):
        print(f"skipped: no tokenizer at {args.tokenizer_from} (scripts/fetch_smollm2.sh)")
        sys.exit(77)
    sys.path.insert(0, args.client)
    try:
        import openai
    except ImportError:
        print(f"skipped: no openai package at {args.client} (scripts/fetch_client_assets.sh)")
        sys.exit(77)

    c = Checks()
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "tiny")
        write_tiny_llama(model, args.tokenizer_from)
        # 32 sequences a step: the 32 concurrent streams below run together (in 8-sequence waves the
        # last ones waited past the client's timeout for their first token under the sanitizers).
        with Server(args.asynct, model, "--max-num-seqs", "32", "--max-waiting", "16", "--max-body-mib", "1",
                    "--warm-up", "on") as server:
            client = openai.OpenAI(base_url=server.url(), api_key="unused", timeout=TIMEOUT, max_retries=0)
            c.equal("/v1/models lists the model", [m.id for m in client.models.list().data], ["tiny"])

            prompt = "The quick brown fox"
            want = generate(args.asynct, model, prompt, 12)
            done = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
            c.equal("completion text = asynct generate's (greedy)", done.choices[0].text, want)
            c.equal("completion usage", (done.usage.completion_tokens, done.usage.total_tokens - done.usage.prompt_tokens),
                    (12, 12))
            c.equal("completion finish_reason", done.choices[0].finish_reason, "length")
            chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
            c.equal("streamed completion = the whole one", "".join(ch.choices[0].text for ch in chunks if ch.choices), want)
            c.equal("stream ends with usage", chunks[-1].usage.completion_tokens if chunks[-1].usage else None, 12)

            ids = client.completions.create(model="tiny", prompt=[1000, 2000, 3000], max_tokens=40, temperature=0,
                                            extra_body={"ignore_eos": True})
            c.equal("token-id prompt, ignore_eos: every token generated", (ids.usage.prompt_tokens, ids.usage.completion_tokens,
                                                                          ids.choices[0].finish_reason), (3, 40, "length"))
            # Prefix caching: the second request with a 40-token prompt finds its first two blocks of
            # 16 (never the last token) cached, and says so in usage.prompt_tokens_details.
            cached = [client.completions.create(model="tiny", prompt=list(range(500, 540)), max_tokens=2, temperature=0)
                      .usage.prompt_tokens_details.cached_tokens for _ in range(2)]
            c.equal("usage.prompt_tokens_details.cached_tokens: none, then two blocks", cached, [0, 32])

            # Logprobs: the engine's, as asynct generate --logprobs prints them.
            reference = json.loads(generate(args.asynct, model, prompt, 6, extra=["--logprobs", "2", "--json"]))
            want_lp = [(t["logprob"], [u["logprob"] for u in t["top_logprobs"]]) for t in reference["logprobs"]]
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=2)
            lp = got.choices[0].logprobs
            c.equal("completion logprobs = asynct generate's",
                    [(round(a, 5), [round(v, 5) for v in sorted(top.values(), reverse=True)])
                     for a, top in zip(lp.token_logprobs, lp.top_logprobs)],
                    [(round(a, 5), [round(v, 5) for v in top]) for a, top in want_lp])
            streamed_lp = [x for ch in client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                                                 logprobs=2, stream=True)
                           if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.token_logprobs]
            c.equal("streamed completion logprobs = the whole one's", streamed_lp, lp.token_logprobs)
            reference = json.loads(generate(args.asynct, model, "What is the capital of France?", 5, chat=True,
                                            extra=["--logprobs", "3", "--json"]))
            got = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                                 max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
            c.equal("chat logprobs = asynct generate --chat's",
                    [(round(t.logprob, 5), [round(u.logprob, 5) for u in t.top_logprobs], bytes(t.bytes).decode(errors="replace"))
                     for t in got.choices[0].logprobs.content],
                    [(round(t["logprob"], 5), [round(u["logprob"], 5) for u in t["top_logprobs"]], t["token"])
                     for t in reference["logprobs"]])

            # logit_bias: -100 on the greedy first token changes it; +100 on a token forces it (sampled
            # too), on both endpoints; logprobs stay the model's own.
            def token_ids(text):
                body = json.dumps({"model": "tiny", "prompt": text, "add_special_tokens": False}).encode()
                return raw(server.port, "POST", "/tokenize", body)[1]["tokens"]
            first = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0, logprobs=0)
            first_ids = token_ids(first.choices[0].text)
            c.equal("the greedy first token's text is one token", len(first_ids), 1)
            banned = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0,
                                               logit_bias={str(first_ids[0]): -100})
            c.equal("logit_bias -100 on the greedy first token changes it", banned.choices[0].text != first.choices[0].text, True)
            forced_id = token_ids(" Paris")[0]
            forced_text = raw(server.port, "POST", "/detokenize", json.dumps({"tokens": [forced_id]}).encode())[1]["prompt"]
            forced = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0.9, seed=5,
                                               logit_bias={str(forced_id): 100}, logprobs=0)
            c.equal("logit_bias +100 forces the token at every step", forced.choices[0].text, forced_text * 4)
            c.equal("logit_bias leaves logprobs the model's own (the forced token is less likely than the greedy one)",
                    forced.choices[0].logprobs.token_logprobs[0] < first.choices[0].logprobs.token_logprobs[0], True)
            chat_forced = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                                         temperature=0, logit_bias={str(forced_id): 100})
            c.equal("chat logit_bias +100 forces the token", chat_forced.choices[0].message.content, forced_text * 3)

            sampled = ["--temperature", "0.9", "--top-k", "40", "--seed", "7"]
            want_sampled = generate(args.asynct, model, prompt, 10, extra=sampled)
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0.9,
                                            extra_body={"top_k": 40}, seed=7)
            c.equal("seeded sampling = asynct generate's", got.choices[0].text, want_sampled)

            # Without a seed every request draws anew: three sampled answers are not all one.
            seedless = [client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=1.0)
                        .choices[0].text for _ in range(3)]
            c.equal("seedless sampling: three requests, not three equal answers", len(set(seedless)) > 1, True)
            again = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0.9,
                                              extra_body={"top_k": 40}, seed=7)
            c.equal("a seeded request repeats", again.choices[0].text, want_sampled)

            # n choices: choice i draws with seed + i (as asynct generate's request i); greedy ones agree.
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0.9,
                                            extra_body={"top_k": 40}, seed=7, n=3)
            want_n = [want_sampled] + [generate(args.asynct, model, prompt, 10,
                                                extra=["--temperature", "0.9", "--top-k", "40", "--seed", str(7 + i)])
                                       for i in (1, 2)]
            c.equal("n = 3: each choice = asynct generate's with seed + i",
                    [(ch.index, ch.text) for ch in got.choices], list(enumerate(want_n)))
            c.equal("n = 3: usage counts every choice's tokens", got.usage.completion_tokens, 30)
            by_index = {}
            for ch in client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0.9,
                                                extra_body={"top_k": 40}, seed=7, n=3, stream=True):
                for choice in ch.choices:
                    by_index[choice.index] = by_index.get(choice.index, "") + choice.text
            c.equal("n = 3 streamed: the same choices", [by_index.get(i) for i in range(3)], want_n)

            question = "What is the capital of France?"
            want_chat = generate(args.asynct, model, question, 9, chat=True)
            messages = [{"role": "user", "content": question}]
            done = client.chat.completions.create(model="tiny", messages=messages, max_tokens=9, temperature=0)
            c.equal("chat text = asynct generate --chat's", done.choices[0].message.content, want_chat)
            streamed = "".join(ch.choices[0].delta.content or "" for ch in
                               client.chat.completions.create(model="tiny", messages=messages, max_tokens=9,
                                                              temperature=0, stream=True))
            c.equal("streamed chat = the whole one", streamed, want_chat)

            if len(want) > 6:
                stop = want[3:6]
                got = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
                c.equal("a stop string ends the text before it", (got.choices[0].text, got.choices[0].finish_reason),
                        (want[:want.index(stop)], "stop"))

            # 32 concurrent streams, 8 closed mid-stream.
            results, lock = {}, threading.Lock()

            def stream(i):
                s = client.completions.create(model="tiny", prompt=f"{prompt} {i}", max_tokens=24, temperature=0,
                                              stream=True)
                text = ""
                for n, chunk in enumerate(s):
                    text += chunk.choices[0].text
                    if i % 4 == 0 and n == 2:
                        s.close()
                        text = None
                        break
                with lock:
                    results[i] = text

            threads = [threading.Thread(target=stream, args=(i,)) for i in range(32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            alone = {i: client.completions.create(model="tiny", prompt=f"{prompt} {i}", max_tokens=24,
                                                  temperature=0).choices[0].text for i in range(32) if i % 4}
            c.equal("32 concurrent streams (8 closed): the others complete and as if alone",
                    {i: results.get(i) for i in alone}, alone)
            c.equal("the server is alive after", raw(server.port, "GET", "/health")[0], 200)

            # A whole (not streamed) response's client leaves: its request ends ("abort") and frees
            # its blocks within a few seconds (the server writes a space a second while it runs).
            def scrape():
                values = {}
                for line in raw(server.port, "GET", "/metrics")[1].splitlines():
                    if line and not line.startswith("#"):
                        name, value = line.rsplit(" ", 1)
                        values[name] = float(value)
                return values
            # A client that accepts gzip (as the openai client does) gets the body compressed, and
            # the compressor holds the spaces back: the server checks the connection itself.
            for encoding in (b"", b"Accept-Encoding: gzip, deflate\r\n"):
                aborted_before = scrape().get('asynct_requests_total{finish_reason="abort"}', 0)
                leaving = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
                body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4000, "temperature": 0,
                                   "ignore_eos": True}).encode()
                leaving.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
                                encoding + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                time.sleep(0.5)  # (the production CPU backend runs the tiny model's 4000 tokens in a few seconds)
                leaving.close()
                deadline, now = time.monotonic() + 20, scrape()
                while time.monotonic() < deadline and (now.get("asynct_requests_running") or
                                                       now.get('asynct_requests_total{finish_reason="abort"}', 0) == aborted_before):
                    time.sleep(0.2)
                    now = scrape()
                c.equal(f"a whole response's client leaves ({encoding.decode().strip() or 'no encoding'}): its request "
                        "aborted, nothing running",
                        (now.get('asynct_requests_total{finish_reason="abort"}', 0) - aborted_before,
                         now.get("asynct_requests_running"), now.get("asynct_kv_blocks_used")), (1, 0, 0))

            # Bad requests: status and the field named.
            context_prompt = "word " * 5000
            bad = [
                ("/v1/completions", b"{not json", 400, None),
                ("/v1/completions", b'{"model": "tiny", "prompt": 3}', 400, "prompt"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "n": 100}', 400, "n"),
                ("/v1/completions", b'{"model": "tiny", "prompt": [5, 49152]}', 400, "prompt"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": -5}', 400, "max_tokens"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
                ("/v1/completions", json.dumps({"model": "tiny", "prompt": context_prompt}).encode(), 400, "prompt"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": "warm"}', 400, "temperature"),
                ("/v1/completions", b'{"model": "gpt-4", "prompt": "x"}', 404, "model"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, None),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": []}', 400, "messages"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}', 400,
                 "messages[0].role"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                         b'"response_format": {"type": "xml"}}', 400, "response_format"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                         b'"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}}', 400,
                 "response_format"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "logit_bias": {"49152": 5}}', 400, "logit_bias"),
                ("/v1/completions", b'{"model": "tiny", "prompt": "x", "logit_bias": {"17": 101}}', 400, "logit_bias"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                         b'"logit_bias": {"seventeen": 5}}', 400, "logit_bias"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                         b'"tool_choice": "auto"}', 400, "tool_choice"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
                                         b'"tools": [{"type": "function", "function": {"name": "a b"}}]}', 400, "tools"),
                ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "tool", "content": "x"}]}', 400,
                 "messages[0].tool_call_id"),
            ]
            for path, body, status, param in bad:
                got_status, payload, _ = raw(server.port, "POST", path, body)
                error = payload.get("error", {}) if isinstance(payload, dict) else {}
                c.equal(f"{body[:48]!r}... -> {status}", (got_status, error.get("param"), "message" in error),
                        (status, param, True))

            # The body limit (--max-body-mib 1) counts bytes as they arrive, chunked or not: past it a
            # 413 and the connection closed, the rest unread; under it, chunked works as usual.
            status, payload, closed = upload(server.port, "/v1/completions", [b"x" * 65536] * 1024)  # 64 MiB chunked
            c.equal("a chunked body over the limit -> 413, connection closed",
                    (status, "message" in payload.get("error", {}) if isinstance(payload, dict) else payload, closed),
                    (413, True, True))
            status, payload, closed = upload(server.port, "/v1/completions", [b"x" * 65536] * 1600, chunked=False,
                                             length=100 << 20)  # 100 MiB with Content-Length
            c.equal("a Content-Length over the limit -> 413, connection closed",
                    (status, "message" in payload.get("error", {}) if isinstance(payload, dict) else payload, closed),
                    (413, True, True))
            small = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}).encode()
            status, payload, _ = upload(server.port, "/v1/completions", [small[:10], small[10:]])
            c.equal("a chunked body under the limit works", (status, payload["choices"][0]["text"] if status == 200 else payload),
                    (200, want))

            # /metrics after all of it: 85 requests ended (n = 3 counts 3), nothing running or holding blocks.
            status, text, response = raw(server.port, "GET", "/metrics")
            metrics = {}
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    metrics[name] = float(value)
            ended = sum(v for k, v in metrics.items() if k.startswith("asynct_requests_total{"))
            c.equal("/metrics is Prometheus text", (status, response.getheader("Content-Type").split(";")[0]), (200, "text/plain"))
            c.equal("/metrics: requests ended, first tokens", (ended, metrics.get("asynct_time_to_first_token_seconds_count")),
                    (85, 85))
            c.equal("/metrics: nothing running, waiting or holding KV blocks",
                    [metrics.get(k) for k in ("asynct_requests_running", "asynct_requests_waiting", "asynct_kv_blocks_used")],
                    [0, 0, 0])
            c.equal("/metrics: the chat template's shared prefix came from the prefix cache",
                    metrics.get("asynct_prefix_cache_hits_total", 0) > 0, True)
            c.equal("/metrics: errors by status", [metrics.get(f'asynct_http_errors_total{{status="{s}"}}') for s in (400, 404, 413)],
                    [19, 1, 2])

            # Several prompts in one completion: choice j of prompt i is index i * n + j, each as the
            # prompt alone would give it; usage adds up; streamed too; token-id lists the same.
            pair = ["The quick brown fox", "Once upon a time"]
            alone = [client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0) for p in pair]
            many = client.completions.create(model="tiny", prompt=pair, max_tokens=8, temperature=0, n=2)
            c.equal("a list of prompts, n = 2: choice i * n + j is prompt i's",
                    [(ch.index, ch.text) for ch in many.choices],
                    [(i * 2 + j, alone[i].choices[0].text) for i in range(2) for j in range(2)])
            c.equal("a list of prompts: usage summed", (many.usage.prompt_tokens, many.usage.completion_tokens),
                    (sum(a.usage.prompt_tokens for a in alone), 2 * sum(a.usage.completion_tokens for a in alone)))
            by_index = {}
            for ch in client.completions.create(model="tiny", prompt=pair, max_tokens=8, temperature=0, n=2, stream=True):
                for choice in ch.choices:
                    by_index[choice.index] = by_index.get(choice.index, "") + choice.text
            c.equal("a list of prompts streamed: the same choices", [by_index.get(i) for i in range(4)],
                    [ch.text for ch in many.choices])
            id_lists = [[1000, 2000, 3000], [500, 501]]
            want_ids = [client.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0).choices[0].text
                        for p in id_lists]
            got = client.completions.create(model="tiny", prompt=id_lists, max_tokens=5, temperature=0)
            c.equal("a list of token-id lists", ([ch.text for ch in got.choices], got.usage.prompt_tokens), (want_ids, 5))

            # system_fingerprint in bodies and chunks; models.retrieve.
            fingerprints = {many.system_fingerprint} | {ch.system_fingerprint for ch in client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True)}
            c.equal("system_fingerprint in bodies and chunks", (len(fingerprints), str(many.system_fingerprint)[:10]),
                    (1, "fp_asynct_"))
            c.equal("models.retrieve", (client.models.retrieve("tiny").id, client.models.retrieve("tiny").max_model_len),
                    ("tiny", 4096))
            try:
                client.models.retrieve("gpt-4")
                c.equal("models.retrieve of another model -> 404", "found", "NotFoundError")
            except openai.NotFoundError:
                c.equal("models.retrieve of another model -> 404", "NotFoundError", "NotFoundError")

            # /tokenize and /detokenize in vLLM's shapes, against what the completions count.
            status, tokens, _ = raw(server.port, "POST", "/tokenize", json.dumps({"model": "tiny", "prompt": prompt}).encode())
            c.equal("/tokenize a prompt: its ids, as many as a completion counts",
                    (status, tokens.get("count"), len(tokens.get("tokens", [])), tokens.get("max_model_len")),
                    (200, alone[0].usage.prompt_tokens, alone[0].usage.prompt_tokens, 4096))
            status, text, _ = raw(server.port, "POST", "/detokenize", json.dumps({"tokens": tokens["tokens"]}).encode())
            c.equal("/detokenize gives the prompt back", (status, text), (200, {"prompt": prompt}))
            chat_messages = [{"role": "user", "content": question}]
            status, chat_tokens, _ = raw(server.port, "POST", "/tokenize", json.dumps({"messages": chat_messages}).encode())
            chat_done = client.chat.completions.create(model="tiny", messages=chat_messages, max_tokens=1, temperature=0)
            c.equal("/tokenize messages: as many as the chat counts", (status, chat_tokens.get("count")),
                    (200, chat_done.usage.prompt_tokens))
            status, bare, _ = raw(server.port, "POST", "/tokenize",
                                  json.dumps({"messages": chat_messages, "add_generation_prompt": False}).encode())
            c.equal("/tokenize messages without the generation prompt: fewer tokens",
                    (status, 0 < bare.get("count", 0) < chat_tokens["count"]), (200, True))
            for path, body, want in [("/detokenize", {"tokens": [5, 49152]}, (400, "tokens")),
                                     ("/detokenize", {"tokens": "x"}, (400, "tokens")),
                                     ("/tokenize", {"prompt": 5}, (400, "prompt")),
                                     ("/tokenize", {"prompt": "x", "model": "gpt-4"}, (404, "model"))]:
                status, payload, _ = raw(server.port, "POST", path, json.dumps(body).encode())
                c.equal(f"{path} {body} -> {want[0]}", (status, payload.get("error", {}).get("param")), want)

            # A known route asked with another method: 405 with Allow (a body sent with it is left
            # unread, the connection closed); an unknown route: 404.
            for method, path, body, want in [("GET", "/v1/completions", b"", (405, "POST")),
                                             ("POST", "/v1/models", b'{"x": 1}', (405, "GET")),
                                             ("DELETE", "/health", b"", (405, "GET")),
                                             ("GET", "/v1/nothing", b"", (404, None)),
                                             ("POST", "/v1/nothing", b"{}", (404, None))]:
                status, payload, response = raw(server.port, method, path, body)
                c.equal(f"{method} {path} -> {want[0]}" + (f", Allow: {want[1]}" if want[1] else ""),
                        (status, response.getheader("Allow"), "message" in payload.get("error", {})), (*want, True))

            # Without CORS configured: no CORS headers, and OPTIONS is a method no route takes.
            status, _, response = raw(server.port, "OPTIONS", "/v1/chat/completions", b"",
                                      {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
            c.equal("CORS off by default: a preflight is a 405, no Allow-Origin",
                    (status, response.getheader("Access-Control-Allow-Origin")), (405, None))

            # Structured output (response_format, tool calls), last on this server: its requests are not in the
            # /metrics counts above.
            if args.jsonschema:  # structured_checks.py
                sys.path.insert(0, args.jsonschema)
                import jsonschema
                started = time.monotonic()
                check_structured_output(client, c, jsonschema, token_ids)
                print(f"structured output: {time.monotonic() - started:.1f} s", flush=True)
                started = time.monotonic()
                check_tool_calls(client, c, jsonschema, lambda body: raw(server.port, "POST", "/tokenize",
                                                                         json.dumps(body).encode())[1])
                print(f"tool calls: {time.monotonic() - started:.1f} s", flush=True)

        if args.jsonschema and args.qwen3_tokenizer:  # tool_checks.py
            started = time.monotonic()
            check_qwen3_tool_calls(args.asynct, args.qwen3_tokenizer, work, c, jsonschema, openai)
            print(f"tool calls through Qwen3's template: {time.monotonic() - started:.1f} s", flush=True)

        # An API key (and CORS for one origin): every route but /health and /metrics wants it. This
        # server also decodes speculatively: the same text, the drafts counted in /metrics.
        with Server(args.asynct, model, "--api-key", "s3cret-key", "--allowed-origins", "https://app.example",
                    "--speculative", "ngram") as server:
            keyed = openai.OpenAI(base_url=server.url(), api_key="s3cret-key", timeout=TIMEOUT, max_retries=0)
            got = keyed.completions.create(model="tiny", prompt=pair[0], max_tokens=8, temperature=0)
            c.equal("with the API key (and speculative decoding): served, the same text", got.choices[0].text,
                    alone[0].choices[0].text)
            # (This model's greedy continuation of these ids repeats two of its tokens: drafts from each.)
            repeated = keyed.completions.create(model="tiny", prompt=[505, 1, 2, 3], max_tokens=48,
                                                temperature=0, extra_body={"ignore_eos": True})
            c.equal("a speculative request runs to max_tokens", repeated.usage.completion_tokens, 48)
            _, text, _ = raw(server.port, "GET", "/metrics")
            drafted = [float(line.split()[1]) for line in text.splitlines() if line.startswith("asynct_spec_drafted_tokens_total ")]
            c.equal("/metrics counts the drafted tokens", drafted and drafted[0] > 0, True)
            skipped = [line.split("{")[1].split("}")[0] for line in text.splitlines() if line.startswith("asynct_spec_skipped_rounds_total{")]
            c.equal("/metrics counts the rounds the switch-off rule skipped, by reason", skipped,
                    ['reason="batch"', 'reason="paused"'])
            try:
                openai.OpenAI(base_url=server.url(), api_key="wrong", timeout=TIMEOUT, max_retries=0).models.list()
                c.equal("a wrong API key -> 401", "served", "AuthenticationError")
            except openai.AuthenticationError:
                c.equal("a wrong API key -> 401", "AuthenticationError", "AuthenticationError")
            body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 2}).encode()
            for method, path, payload, headers, want_status in [
                    ("POST", "/v1/completions", body, {}, 401),
                    ("POST", "/v1/completions", body, {"Authorization": "Bearer s3cret-ke"}, 401),
                    ("POST", "/v1/completions", body, {"Authorization": "Bearer s3cret-keyy"}, 401),
                    ("POST", "/v1/completions", body, {"Authorization": "s3cret-key"}, 401),
                    ("GET", "/v1/models", b"", {}, 401),
                    ("GET", "/v1/nothing", b"", {}, 401),
                    ("POST", "/tokenize", b'{"prompt": "x"}', {}, 401),
                    ("POST", "/tokenize", b'{"prompt": "x"}', {"Authorization": "bearer s3cret-key"}, 200),
                    ("GET", "/health", b"", {}, 200),
                    ("GET", "/metrics", b"", {}, 200)]:
                status, payload, response = raw(server.port, method, path, payload, headers)
                error = payload.get("error", {}) if isinstance(payload, dict) else {}
                c.equal(f"{method} {path} {headers or 'without a key'} -> {want_status}",
                        (status, "message" in error if status == 401 else True), (want_status, True))

            # X-Request-Id: the client's echoed when sane, else one made; the access log names it.
            headers = {"Authorization": "Bearer s3cret-key"}
            _, _, response = raw(server.port, "POST", "/v1/completions", body, {**headers, "X-Request-Id": "trace-42"})
            c.equal("X-Request-Id echoed", response.getheader("X-Request-Id"), "trace-42")
            made = [raw(server.port, "GET", "/v1/models", b"", {**headers, **extra})[2].getheader("X-Request-Id")
                    for extra in ({}, {"X-Request-Id": "x" * 300}, {"X-Request-Id": "has space"})]
            c.equal("X-Request-Id made when absent, too long or not printable",
                    [bool(m) and m.startswith("req-") for m in made], [True, True, True])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any("request_id=trace-42" in line for line in server.log):
                time.sleep(0.1)
            line = next((line for line in server.log if "request_id=trace-42" in line), "")
            c.equal("the access log: method, route, status, tokens, times, request id",
                    bool(re.search(r"POST /v1/completions 200 prompt_tokens=\d+ output_tokens=2 ttft_ms=[0-9.]+ "
                                   r"total_ms=[0-9.]+ request_id=trace-42", line)), True)

            # CORS: a preflight from the allowed origin answered without the key; another origin refused.
            status, _, response = raw(server.port, "OPTIONS", "/v1/chat/completions", b"",
                                      {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                                       "Access-Control-Request-Headers": "authorization, content-type"})
            c.equal("CORS preflight from an allowed origin -> 204 with the allowed origin and method",
                    (status, response.getheader("Access-Control-Allow-Origin"), response.getheader("Access-Control-Allow-Methods"),
                     "Authorization" in (response.getheader("Access-Control-Allow-Headers") or "")),
                    (204, "https://app.example", "POST", True))
            status, _, response = raw(server.port, "OPTIONS", "/v1/chat/completions", b"",
                                      {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            c.equal("CORS preflight from another origin -> 403, no Allow-Origin",
                    (status, response.getheader("Access-Control-Allow-Origin")), (403, None))
            status, _, response = raw(server.port, "GET", "/v1/models", b"", {**headers, "Origin": "https://app.example"})
            c.equal("a request from the allowed origin gets Access-Control-Allow-Origin",
                    (status, response.getheader("Access-Control-Allow-Origin")), (200, "https://app.example"))

        # The queue bound: one sequence, none waiting; a second request while the first streams.
        with Server(args.asynct, model, "--max-num-seqs", "1", "--max-waiting", "0") as server:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
            connection.request("POST", "/v1/completions", json.dumps(
                {"model": "tiny", "prompt": "hello", "max_tokens": 4000, "stream": True, "temperature": 0}).encode(),
                {"Content-Type": "application/json"})
            first = connection.getresponse()
            first.readline()  # the first chunk is out: the request is in flight
            status, payload, response = raw(server.port, "POST", "/v1/completions",
                                            b'{"model": "tiny", "prompt": "x", "max_tokens": 2}')
            c.equal("past the queue bound -> 429 with Retry-After", (status, response.getheader("Retry-After")), (429, "1"))
            # SIGTERM with the stream still open: it ends with "abort" and [DONE]; exit 0. /health,
            # asked over and over from before the signal, answers 503 from the moment draining begins.
            health, polling = [], threading.Event()

            def poll_health():
                try:
                    while True:  # a connection a request: httplib closes a kept-alive one after 5
                        poller = http.client.HTTPConnection("127.0.0.1", server.port, timeout=TIMEOUT)
                        poller.request("GET", "/health")
                        response = poller.getresponse()
                        response.read()
                        poller.close()
                        health.append(response.status)
                        polling.set()
                except (OSError, http.client.HTTPException):
                    pass  # the server has closed
                finally:
                    polling.set()
            poller = threading.Thread(target=poll_health, daemon=True)
            poller.start()
            polling.wait(TIMEOUT)
            server.process.send_signal(signal.SIGTERM)
            rest = first.read().decode()
            poller.join(TIMEOUT)
            c.equal("/health: 200 before SIGTERM, then 503 while draining",
                    (health[:1], 503 in health, 200 not in health[health.index(503):] if 503 in health else None),
                    ([200], True, True))
            c.equal("SIGTERM ends the open stream", ('"finish_reason":"abort"' in rest, rest.rstrip().endswith("data: [DONE]")),
                    (True, True))
            c.equal("the server exits 0 after SIGTERM", server.stop(), 0)
    print(f"{'all passed' if not c.failures else str(c.failures) + ' failed'}")
    sys.exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
