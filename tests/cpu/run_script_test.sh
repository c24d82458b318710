#!/usr/bin/env bash
# scripts/run.sh with stand-in build tools on PATH (a cmake whose build fails with a compiler
# message, an nvcc, an nvidia-smi that finds no GPU): the failure's message must reach the user,
# and with nvcc but no GPU the build must be the CPU-only one in build/run-cpu. Nothing is
# built. Exit 77 (skipped) where a GPU device file exists, since run.sh then rightly picks CUDA.
set -uo pipefail
repo="$1"
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT
cat >"$fake/cmake" <<'SH'
#!/usr/bin/env bash
echo "cmake $*" >>"$FAKE_LOG"
if [ "${1:-}" = "--build" ]; then
  echo "[1/3] Building CXX object src/CMakeFiles/asynct.dir/cli/main.cpp.o"
  echo "main.cpp:12:3: error: stand-in compiler error"  # ninja prints a failed command's output on stdout
  exit 1
fi
exit 0
SH
printf '#!/bin/sh\nexit 0\n' >"$fake/nvcc"
printf '#!/bin/sh\necho "No devices were found" >&2\nexit 6\n' >"$fake/nvidia-smi"
chmod +x "$fake/cmake" "$fake/nvcc" "$fake/nvidia-smi"
export FAKE_LOG="$fake/log"

# A copy of the scripts, so that no build directory of the checkout (run.sh configures only a new
# one) hides the configure step.
mkdir -p "$fake/checkout"
cp -r "$repo/scripts" "$fake/checkout/"
repo="$fake/checkout"
out="$(PATH="$fake:$PATH" bash "$repo/scripts/run.sh" generate 2>&1)"
rc=$?
status=0
if [ "$rc" -eq 0 ]; then echo "FAIL: run.sh exited 0 after a failed build"; status=1; fi
if ! grep -q "stand-in compiler error" <<<"$out"; then
  echo "FAIL: the compiler's error message was not shown"; status=1
fi
if ! grep -q "Building CXX object" <<<"$out"; then
  echo "FAIL: the build's progress was not shown"; status=1
fi
if [ -e /dev/nvidia0 ]; then
  echo "skipped the build-directory check: /dev/nvidia0 exists"
  [ "$status" -eq 0 ] && exit 77
else
  if ! grep -q -- "-B $repo/build/run-cpu .*-DASYNCT_CUDA=OFF" "$FAKE_LOG"; then
    echo "FAIL: with nvcc and no GPU the build is not build/run-cpu with ASYNCT_CUDA=OFF:"
    cat "$FAKE_LOG"; status=1
  fi
fi
[ "$status" -eq 0 ] || { echo "--- run.sh said ---"; echo "$out"; }
exit $status
