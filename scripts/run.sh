#!/usr/bin/env bash
# The run command: builds asynct if needed and runs it. With no arguments it runs the
# default job: `asynct generate` on the built-in tiny AsyncT model, on the GPU when the build
# has CUDA and one is present, else on the CPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
source "$root/scripts/env.sh"
cmake -S "$root" -B "$root/build/release" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build/release" --target asynct -j "$(nproc)" >/dev/null
exec "$root/build/release/src/asynct" "$@"
