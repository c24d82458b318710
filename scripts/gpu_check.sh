#!/usr/bin/env bash
# On a GPU machine (Hopper): builds asynct for sm_90a, runs the GPU tests, runs one GPU test
# binary under compute-sanitizer, measures the ceilings and runs the benchmarks, then prints a
# short table. Results go to $OUT (the device tool's output folder) or build/gpu-out.
#
# Needs the Debian packages of scripts/device_deps.sh in .deps/ when the machine lacks them.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-build/gpu-out}"
out="$(cd "${OUT:-build/gpu-out}" && pwd)"
export PATH="/usr/local/cuda/bin:$PATH"
status=0

prefix=""
if compgen -G ".deps/*.deb" >/dev/null; then
  mkdir -p .deps/root
  for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
  prefix="$PWD/.deps/root/usr"
fi

echo "== build (sm_90a) =="
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DASYNCT_CUDA=ON \
  -DASYNCT_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" \
  ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }

echo "== GPU tests =="
# GPU_TEST_FILTER narrows the run (a gtest filter); a hung kernel is cut off by the timeout.
timeout 300 build/gpu/tests/asynct_gpu_tests --gtest_filter="${GPU_TEST_FILTER:-*}" \
  >"$out/gpu_tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED) |tests ran|Failure" "$out/gpu_tests.log" | head -40

echo "== engine against PyTorch (HF Qwen3, the AsyncT reference) =="
ctest --test-dir build/gpu -L torch --output-on-failure >"$out/torch_tests.log" 2>&1 || status=1
tail -2 "$out/torch_tests.log"

echo "== compute-sanitizer (memcheck, small cases) =="
if command -v compute-sanitizer >/dev/null; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/asynct_gpu_tests \
    --gtest_filter="${SANITIZER_FILTER:-*Plumbing*:*Small*}" >"$out/sanitizer.log" 2>&1 || status=1
  tail -3 "$out/sanitizer.log"
fi

echo "== benchmarks =="
(cd bench && python3 ceilings.py --json "$out/ceilings.json") || status=1
# BENCHES picks some (e.g. "decode norms"); default: every bench/bench_*.py.
for name in ${BENCHES:-$(ls bench/bench_*.py | sed 's|bench/bench_||; s|\.py$||')}; do
  PYTHONUNBUFFERED=1 python3 "bench/bench_$name.py" --lib "$PWD/build/gpu" --out "$out" || status=1
done
# The four end-to-end scenarios at the 1.7B configuration (SCENARIOS=0 skips them).
if [ "${SCENARIOS:-1}" != 0 ]; then
  timeout 900 build/gpu/src/asynct bench --config 1.7b --scale 1 --device cuda --json "$out/scenarios.json" \
    2>"$out/scenarios.log" || status=1
fi
exit $status
