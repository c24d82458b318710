#!/usr/bin/env python3
"""The README's serving examples, run as written against `asynct serve` on SmolLM2-135M-Instruct
(the CPU backend): its curl line and its `openai` snippet, with only the port changed (the
server takes a free one). The curl answer must name Paris; the snippet must print English.

    python3 tests/serve/readme_examples.py --asynct build/release/src/asynct \\
        --model ~/.cache/asynct/smollm2-135m-instruct --client ~/.cache/asynct/python-openai

Exit 77 (skipped) without the model, the client or curl.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_harness import Server  # noqa: E402

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def block_with(text, language, marker):
    """The README's fenced block in `language` that holds `marker`."""
    for body in re.findall(r"```" + language + r"\n(.*?)```", text, re.S):
        if marker in body:
            return body
    raise SystemExit(f"readme_examples: no ```{language} block with {marker!r} in README.md")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asynct", required=True)
    parser.add_argument("--model", required=True, help="SmolLM2-135M-Instruct converted (scripts/fetch_smollm2.sh)")
    parser.add_argument("--client", required=True, help="where the openai package is (scripts/fetch_client_assets.sh)")
    args = parser.parse_args()
    missing = [what for what, there in (("the model", os.path.isfile(os.path.join(args.model, "config.json"))),
                                         ("the openai client", os.path.isdir(args.client)),
                                         ("curl", shutil.which("curl") is not None)) if not there]
    if missing:
        print("readme_examples: skipped, no " + ", no ".join(missing))
        return 77
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    curl = block_with(readme, "sh", "curl -s http://127.0.0.1:8000/v1/chat/completions")
    snippet = block_with(readme, "python", "from openai import OpenAI")
    name = os.path.basename(os.path.normpath(args.model))
    failures = 0
    with Server(args.asynct, args.model, name=name) as server:
        port = str(server.port)
        answer = subprocess.run(["bash", "-c", curl.replace("8000", port)], capture_output=True, text=True, timeout=600)
        try:
            content = json.loads(answer.stdout)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError):
            content = None
        ok = content is not None and "Paris" in content
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} README curl: {content!r}" + ("" if ok else f"\n{answer.stdout}{answer.stderr}"))
        env = dict(os.environ, PYTHONPATH=args.client + os.pathsep + os.environ.get("PYTHONPATH", ""))
        printed = subprocess.run([sys.executable, "-c", snippet.replace("8000", port)], capture_output=True, text=True,
                                 timeout=600, env=env)
        ok = printed.returncode == 0 and len(re.findall(r"[A-Za-z]+", printed.stdout)) >= 5
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} README openai snippet: {printed.stdout.strip()[:200]!r}" +
              ("" if ok else f"\n{printed.stderr}"))
        stopped = server.stop()
        failures += stopped != 0
        print(f"{'ok  ' if stopped == 0 else 'FAIL'} the server exits 0 after SIGTERM")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
