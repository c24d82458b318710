#!/usr/bin/env bash
# On a GPU machine (Hopper): builds asynct for sm_90a, runs the GPU tests, compute-sanitizer on
# the small ones, the engine against PyTorch, the kernel benchmarks and the 1.7B scenarios,
# printing a short summary of each. Logs and JSON results go to $OUT (the device tool's output
# folder) or build/gpu-out; at the end the logs are packed into one logs-HHMMSS.tgz there.
#
# STAGES picks what runs, in this order (default: build tests sanitizer torch bench scenarios sampling):
#   build tests sanitizer torch bench scenarios sampling fp8 fp8_cache speculative serve timeline prefill_profile decode_profile probes
# e.g. STAGES="build tests sanitizer" for a correctness pass, STAGES="build bench" for timings,
# STAGES="build sampling" for the device sampler's kernel bench and decode_heavy_b32 greedy against
# sampled, STAGES="build fp8" for the FP8-weight product's bench and the 1.7B decode scenarios on
# FP8 projections beside bf16 (FP8_SCENARIOS narrows them), STAGES="build fp8_cache" for the 1.7B
# scenarios on an FP8 KV cache beside bf16, with bf16 and FP8 weights (FP8_CACHE_SCENARIOS), STAGES="build timeline" for where a decode step's time goes (the kernel timeline of both
# models' decode_heavy_b32 steps), STAGES="build serve" for asynct serve at 1.7B against the same
# load in process (SERVE_ARCHS, SERVE_RATES narrow it), STAGES=probes for the design probes in bench/*_probe.cu (what
# a dependency costs; what the decode step's structure costs with no math in it),
# STAGES="build prefill_profile" for the prefill kernel's clock under load and ncu (PROFILE_SHAPES),
# STAGES="build decode_profile" for ncu over the decode kernel on bf16 and e4m3 caches (DECODE_PROFILE_SHAPES),
# STAGES="build speculative" for a 1.7B step verifying 4 drafts against a one-token step, decode_heavy_b32
# with speculation on against off, and
# bench/bench_speculative.py on SmolLM2, a process a request and a warm server (once scripts/device_smollm2.sh has unpacked it into
# $ASYNCT_CACHE, default /tmp/asynct-cache; SPECULATIVE_ROUNDS, default 2).
# BUILD_TARGETS builds only those targets (e.g. "asynct"); GPU_TEST_TIMEOUT, SANITIZER_TIMEOUT (seconds), GPU_TEST_FILTER, SANITIZER_FILTER (gtest filters), BENCHES
# (e.g. "decode norms"), SCENARIO_SCALE and SCENARIO_REPEAT (runs per model, median reported)
# narrow or widen further. Needs the Debian packages of scripts/device_deps.sh in .deps/ when the machine
# lacks GoogleTest, nlohmann-json and CLI11.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-build/gpu-out}"
out="$(cd "${OUT:-build/gpu-out}" && pwd)"
export PATH="/usr/local/cuda/bin:$PATH"
stages="${STAGES:-build tests sanitizer torch bench scenarios sampling}"
status=0
want() { [[ " $stages " == *" $1 "* ]]; }

# The CUPTI kernel timeline (bench/kernel_timeline.cpp) as an injection library.
build_timeline() {
  local cupti_lib cupti_inc=/usr/local/cuda/include
  cupti_lib="$(dirname "$(find /usr/local/cuda/ -name 'libcupti.so*' 2>/dev/null | head -1)")"
  [ -f "$cupti_inc/cupti.h" ] || cupti_inc=/usr/local/cuda/extras/CUPTI/include
  g++ -std=c++20 -O2 -shared -fPIC bench/kernel_timeline.cpp -I"$cupti_inc" -L"$cupti_lib" -lcupti \
    -Wl,-rpath,"$cupti_lib" -o build/gpu/libkernel_timeline.so
}

# ncu over one shape of a kernel benchmark's --profile launches (PREFIX KERNEL_REGEX SKIP COUNT
# SCRIPT SHAPE SUMMARY): $out/PREFIX_SHAPE_{run,details,source}.txt, the source page summarised by
# the kernel's parts (bench/ncu_source.py); prints the details' lines matching SUMMARY.
ncu_profile() {
  local rep="$out/$1_$6" rc=0
  timeout 240 ncu --clock-control none -k "regex:$2" --launch-skip "$3" --launch-count "$4" --set full \
    --import-source yes -f -o "$rep" python3 "bench/$5" --lib "$PWD/build/gpu" --out "$out" \
    --shapes "$6" --profile >"${rep}_run.txt" 2>&1 || { tail -5 "${rep}_run.txt"; return 1; }
  ncu -i "$rep.ncu-rep" --page details >"${rep}_details.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --print-source sass --csv 2>/dev/null | gzip >"${rep}_source.csv.gz"
  python3 bench/ncu_source.py "${rep}_source.csv.gz" >"${rep}_source.txt" 2>&1 || rc=1
  grep -E "$7" "${rep}_details.txt"
  rm -f "$rep.ncu-rep" "${rep}_source.csv.gz"
  return $rc
}

if want build; then
  echo "== build (sm_90a) =="
  prefix=""
  if compgen -G ".deps/*.deb" >/dev/null; then
    mkdir -p .deps/root
    for f in .deps/*.deb; do dpkg -x "$f" .deps/root; done
    prefix="$PWD/.deps/root/usr"
    # Text support and the server are found through pkg-config: the unpacked packages' .pc files
    # name /usr, which the sysroot maps into .deps/root.
    deps_lib="$PWD/.deps/root/usr/lib/x86_64-linux-gnu"
    export PKG_CONFIG_PATH="$deps_lib/pkgconfig:$PWD/.deps/root/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$PWD/.deps/root"
    # The binaries find the libraries they link through their build RPATH; what those libraries
    # load in turn (ICU's data, cpp-httplib's brotli, and OpenSSL and zlib where the machine has
    # none) through a library path of just those. The machine's own OpenSSL and zlib stay first
    # for every other program, PyTorch's included.
    mkdir -p .deps/runtime
    ln -sf "$deps_lib"/libicu*.so.72* "$deps_lib"/libbrotli*.so.1* .deps/runtime/
    for lib in libssl.so.3 libcrypto.so.3 libz.so.1; do
      ldconfig -p 2>/dev/null | grep -q "$lib " || find "$PWD/.deps/root" -name "$lib*" -exec ln -sf {} .deps/runtime/ \;
    done
    export LD_LIBRARY_PATH="$PWD/.deps/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! command -v pkg-config >/dev/null && [ -x .deps/root/usr/bin/pkgconf ]; then
      printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$deps_lib" "$PWD/.deps/root/usr/bin/pkgconf" >.deps/pkgconf
      chmod +x .deps/pkgconf
      export PKG_CONFIG="$PWD/.deps/pkgconf"
    fi
  fi
  # Structured output needs xgrammar's unpacked sdist: carried as build/device-xgrammar (the
  # machine reaches no index).
  grammar=""
  [ -f build/device-xgrammar/CMakeLists.txt ] && grammar="$PWD/build/device-xgrammar"
  cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DASYNCT_CUDA=ON \
    -DASYNCT_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" \
    ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} ${grammar:+-DASYNCT_XGRAMMAR_DIR="$grammar"} \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  start=$SECONDS
  cmake --build build/gpu -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >"$out/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
  echo "built in $((SECONDS - start)) s"
fi

if want tests; then
  echo "== GPU tests =="
  # A hung kernel is cut off by the timeout instead of eating the machine's time.
  timeout "${GPU_TEST_TIMEOUT:-480}" build/gpu/tests/asynct_gpu_tests --gtest_filter="${GPU_TEST_FILTER:-*}" \
    >"$out/gpu_tests.log" 2>&1 || status=1
  grep -E "^\[ *(OK|PASSED|FAILED) *\]|tests ran|Failure|relative error" "$out/gpu_tests.log" | head -100
fi

if want sanitizer && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck: the small cases, the sampler's non-finite and penalised draws) =="
  timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 9 build/gpu/tests/asynct_gpu_tests \
    --gtest_filter="${SANITIZER_FILTER:-*Plumbing*:*Small*:Fp8Linear.*:DeviceSampleRows.ReportsNonFinite*:DeviceSampleRows.PenalisedDrawsMatchTheHost}" >"$out/sanitizer.log" 2>&1 || status=1
  tail -3 "$out/sanitizer.log"
fi

if want torch; then
  echo "== engine against PyTorch (HF Qwen3, the AsyncT reference) =="
  timeout 120 ctest --test-dir build/gpu -L torch --output-on-failure >"$out/torch_tests.log" 2>&1 || status=1
  grep -E "ok|FAIL|passed" "$out/torch_tests.log" | tail -8
fi

if want bench; then
  echo "== kernel benchmarks =="
  (cd bench && timeout 60 python3 ceilings.py --json "$out/ceilings.json") || status=1
  for name in ${BENCHES:-$(ls bench/bench_*.py | sed 's|bench/bench_||; s|\.py$||')}; do
    PYTHONUNBUFFERED=1 timeout 240 python3 "bench/bench_$name.py" --lib "$PWD/build/gpu" --out "$out" || status=1
  done
fi

if want scenarios; then
  echo "== the four scenarios, 1.7B, AsyncT against Qwen3 =="
  timeout 500 build/gpu/src/asynct bench --config 1.7b --scale "${SCENARIO_SCALE:-1}" --repeat "${SCENARIO_REPEAT:-1}" --device cuda \
    --json "$out/scenarios.json" 2>"$out/scenarios.log" || status=1
fi
if want sampling; then
  echo "== the device sampler: the kernel, and decode_heavy_b32 greedy against sampled (1.7B) =="
  for sigma in 2.5 0.3 45; do
    timeout 120 build/gpu/bench/asynct_bench_sampling 32 151936 "$sigma" 2>&1 | tee -a "$out/bench_sampling.txt" || status=1
  done
  for scenario in decode_heavy_b32 decode_heavy_b32_sampled; do
    timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario "$scenario" --repeat "${SCENARIO_REPEAT:-3}" \
      --json "$out/$scenario.json" >"$out/$scenario.log" 2>&1 || status=1
    grep -E "decode steps|$scenario" "$out/$scenario.log" | tail -4
  done
fi
if want fp8; then
  echo "== FP8 weights: the product against bf16 and the ceiling; decode_b1 and decode_heavy_b32 (1.7B) on FP8 projections =="
  timeout 120 build/gpu/bench/asynct_bench_fp8_linear 2>&1 | tee "$out/bench_fp8_linear.txt" || status=1
  for scenario in ${FP8_SCENARIOS:-decode_b1 decode_heavy_b32}; do
    for quantization in none fp8; do
      timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario "$scenario" --quantization "$quantization" \
        --repeat "${SCENARIO_REPEAT:-3}" --json "$out/${scenario}_$quantization.json" >"$out/${scenario}_$quantization.log" 2>&1 || status=1
      echo "-- $scenario, --quantization $quantization"; grep -E "decode steps|$scenario" "$out/${scenario}_$quantization.log" | tail -3
    done
  done
fi
if want fp8_cache; then
  echo "== the FP8 KV cache: 1.7B scenarios with --kv-cache-dtype fp8 beside bf16 (and with FP8 weights too) =="
  for scenario in ${FP8_CACHE_SCENARIOS:-long_decode_b32 decode_heavy_b32 decode_b1}; do
    for form in "bf16 none" "fp8 none" "fp8 fp8"; do
      set -- $form
      name="${scenario}_kv$1_weights$2"
      timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario "$scenario" --kv-cache-dtype "$1" \
        --quantization "$2" --repeat "${SCENARIO_REPEAT:-3}" --json "$out/$name.json" >"$out/$name.log" 2>&1 || status=1
      echo "-- $scenario, --kv-cache-dtype $1 --quantization $2"; grep -E "decode steps|^$scenario|rror" "$out/$name.log" | tail -4
    done
  done
fi
if want speculative; then
  echo "== a step verifying 4 drafts against a one-token step (1.7B decode_b1, every draft kept: --speculative forced) =="
  for method in none forced; do
    timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario decode_b1 --speculative "$method" \
      --speculative-tokens 4 --repeat "${SCENARIO_REPEAT:-3}" --json "$out/decode_b1_speculative_$method.json" \
      >"$out/decode_b1_speculative_$method.log" 2>&1 || status=1
    echo "-- --speculative $method"; grep -E "decode steps|drafts" "$out/decode_b1_speculative_$method.log" | tail -3
  done
  echo "== decode_heavy_b32 with speculation on (ngram: the switch-off rule at 32 sequences) against off =="
  for method in none ngram; do
    timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario decode_heavy_b32 --speculative "$method" \
      --repeat "${SCENARIO_REPEAT:-3}" --json "$out/decode_heavy_b32_speculative_$method.json" \
      >"$out/decode_heavy_b32_speculative_$method.log" 2>&1 || status=1
    echo "-- --speculative $method"; grep -E "^decode_heavy_b32|decode steps|drafts" "$out/decode_heavy_b32_speculative_$method.log" | tail -4
  done
  echo "== speculative decoding at batch 1: rewrite and chat prompts, ngram and suffix against none (SmolLM2) =="
  smollm2_dir="${ASYNCT_CACHE:-/tmp/asynct-cache}/smollm2-135m-instruct"
  if [ -f "$smollm2_dir/config.json" ]; then
    timeout 400 python3 bench/bench_speculative.py --build build/gpu --model "$smollm2_dir" --device cuda --allow-divergence \
      --rounds "${SPECULATIVE_ROUNDS:-2}" --out "$out/bench_speculative.json" >"$out/bench_speculative.txt" 2>&1 || status=1
    grep -E "^\||differs" "$out/bench_speculative.txt"
    echo "-- the same through a warm asynct serve (a server a method, after a warm-up pass)"
    timeout 400 python3 bench/bench_speculative.py --build build/gpu --model "$smollm2_dir" --device cuda --allow-divergence \
      --rounds "${SPECULATIVE_ROUNDS:-2}" --serve --out "$out/bench_speculative_serve.json" >"$out/bench_speculative_serve.txt" 2>&1 || status=1
    grep -E "^\||differs" "$out/bench_speculative_serve.txt"
  else
    echo "-- SmolLM2 not unpacked ($smollm2_dir): scripts/device_smollm2.sh"; status=1
  fi
fi
if want serve; then
  # Needs the server in the build (.deps/ from scripts/device_deps.sh) and a Qwen3 tokenizer.json
  # and tokenizer_config.json in $SERVE_TOKENIZER (default build/device-qwen3: carry it); SERVE_JSON=1
  # adds a 32-stream load unconstrained and under a JSON schema (needs build/device-xgrammar). SmolLM2
  # runs too when scripts/device_smollm2.sh has unpacked it into $ASYNCT_CACHE (or from
  # $SERVE_SMOLLM2). SERVE_MODELS picks the models; SERVE_RATES and SERVE_RATES_SMOLLM2 the
  # sweeps' rates (empty: no sweep). SERVE_TIMELINE=1 runs the servers under the kernel timeline
  # and prints the GPU's view of the last steps (the short prompts'); SERVE_C64=0 leaves out the
  # 64-stream load and its in-process anchor; SERVE_FIRST_WAVE=1 times a fresh server's first 64
  # requests against the next 64; SERVE_ARGS adds options to asynct serve (e.g. --warm-up off).
  echo "== asynct serve: HTTP against the same load in process, a request-rate sweep, a shared system prompt =="
  tokenizer="${SERVE_TOKENIZER:-build/device-qwen3}"
  smollm2="${SERVE_SMOLLM2:-${ASYNCT_CACHE:-/tmp/asynct-cache}/smollm2-135m-instruct}"
  models="${SERVE_MODELS:-asynct qwen3 smollm2}"
  if [[ "${SERVE_C64:-1}" = 1 && ( " $models " == *" asynct "* || " $models " == *" qwen3 "* ) ]]; then
    timeout 240 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario serve_load_c64 --repeat 1 \
      --json "$out/serve_inprocess_1p7b.json" >"$out/serve_inprocess_1p7b.log" 2>&1 || status=1
    grep -E "^serve_load_c64" "$out/serve_inprocess_1p7b.log"
  fi
  seed=1
  for model in $models; do
    if [ "$model" = smollm2 ]; then
      dir="$smollm2"
      [ -f "$dir/config.json" ] || { echo "-- smollm2: not unpacked ($dir)"; continue; }
      if [ "${SERVE_C64:-1}" = 1 ]; then
        timeout 120 build/gpu/src/asynct bench --model "$dir" --device cuda --scenario serve_load_c64 --repeat 1 \
          --json "$out/serve_inprocess_smollm2.json" >"$out/serve_inprocess_smollm2.log" 2>&1 || status=1
        grep -E "^serve_load_c64" "$out/serve_inprocess_smollm2.log"
      fi
      rates="${SERVE_RATES_SMOLLM2-32 64 96 128 160}" range=1000,40000
    else
      dir="/tmp/asynct-serve-$model-1.7b"
      if [ ! -f "$dir/config.json" ]; then
        build/gpu/src/asynct init-checkpoint --arch "$model" --config 1.7b --out "$dir" >"$out/serve_init_$model.log" 2>&1 || { status=1; continue; }
        cp "$tokenizer/tokenizer.json" "$tokenizer/tokenizer_config.json" "$dir/"
      fi
      rates="${SERVE_RATES-16 32 40 48 52 56 64}" range=1000,10000
    fi
    # The engine options of the in-process load (ScenarioOptions: an 8192-token step budget).
    timeline_env=()
    if [ "${SERVE_TIMELINE:-0}" = 1 ] && { [ -f build/gpu/libkernel_timeline.so ] || build_timeline; }; then
      timeline_env=(ASYNCT_TIMELINE_OUT="$out/timeline_$model.csv" CUDA_INJECTION64_PATH="$PWD/build/gpu/libkernel_timeline.so")
    fi
    env "${timeline_env[@]}" build/gpu/src/asynct serve --model "$dir" --port 8011 --max-model-len 4352 --max-cache-mib 24576 --max-waiting 1024 \
      --max-batched-tokens 8192 ${SERVE_ARGS:-} >"$out/serve_$model.log" 2>&1 &
    server=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8011/health >/dev/null 2>&1 && break; sleep 1; done
    bench() {  # name, then bench_serve.py's arguments; every run its own prompts (no cache hits across runs)
      local name="$1"; shift
      seed=$((seed + 1))
      timeout 300 python3 bench/bench_serve.py --url http://127.0.0.1:8011/v1 --seed "$seed" --token-range "$range" \
        --json "$out/serve_${model}_$name.json" "$@" >"$out/serve_${model}_$name.txt" 2>&1 || status=1
      echo "-- $model $name: $*"; grep -E "completed|requests|ttft|tpot|shared prefix|server side|error" "$out/serve_${model}_$name.txt"
    }
    # A fresh server's first requests load kernels, plan products and capture graphs: with
    # SERVE_FIRST_WAVE=1 its first 64 requests are timed as they come, then 64 more on the
    # now warm server (issue 44's first-wave goal: the first TTFT p50 within 1.2x of the second).
    if [ "${SERVE_FIRST_WAVE:-0}" = 1 ]; then
      bench first_wave --input-len 1024 --output-len 64 --num-prompts 64 --concurrency 64
      bench second_wave --input-len 1024 --output-len 64 --num-prompts 64 --concurrency 64
    fi
    # The in-process anchor has its untimed run for the same, so each load below has its warm-up.
    [ "${SERVE_C64:-1}" = 1 ] && bench c64 --input-len 1024 --output-len 256 --num-prompts 256 --concurrency 64 --warmup-prompts 64
    if [ "${SERVE_JSON:-0}" = 1 ]; then  # 32 streams, unconstrained and under a JSON schema (xgrammar's masks)
      [ -x build/gpu/bench/asynct_bench_structured_output ] &&
        build/gpu/bench/asynct_bench_structured_output "$dir/tokenizer.json" 151936 128 | tee "$out/structured_output_host.txt"
      bench c32 --input-len 1024 --output-len 256 --num-prompts 128 --concurrency 32 --warmup-prompts 32
      bench json_c32 --input-len 1024 --output-len 256 --num-prompts 128 --concurrency 32 --warmup-prompts 32 \
        --response-format json_schema
    fi
    for rate in $rates; do
      bench "rate$rate" --input-len 1024 --output-len 256 --num-prompts $((rate * 6)) --concurrency 2048 --request-rate "$rate"
    done
    # One output token: the server's step figures are then the prompts' steps alone.
    bench shared_prefix --input-len 4160 --shared-prefix-len 4096 --output-len 1 --num-prompts 8 --concurrency 1 --warmup-prompts 2
    bench short_prompt --input-len 64 --output-len 1 --num-prompts 8 --concurrency 1 --warmup-prompts 2
    curl -s http://127.0.0.1:8011/metrics >"$out/serve_${model}_metrics.txt"
    grep -E "^asynct_engine_(steps_total|pipelined_steps_total|step_seconds_(sum|count)|gap_seconds_(sum|count))" \
      "$out/serve_${model}_metrics.txt" | tr '\n' ' '; echo
    kill -TERM "$server"; wait "$server" || status=1
    if [ -f "$out/timeline_$model.csv" ]; then
      python3 bench/timeline_step.py "$out/timeline_$model.csv" --last 16 | tee "$out/serve_${model}_timeline.txt" | head -60
      rm -f "$out/timeline_$model.csv"
    fi
  done
  # (named apart from serve_*: a second serve run in the same $OUT must not pack this archive into its own)
  (cd "$out" && tar czf "results-serve-$(date +%H%M%S).tgz" serve_* && rm -f serve_*.json serve_*.txt serve_*.log)
fi
if want timeline; then
  echo "== the decode step's kernel timeline (CUPTI) =="
  if build_timeline; then
    ASYNCT_TIMELINE_OUT="$out/timeline.csv" CUDA_INJECTION64_PATH="$PWD/build/gpu/libkernel_timeline.so" \
      timeout 200 build/gpu/src/asynct bench --config 1.7b --device cuda --scenario decode_heavy_b32 --repeat 1 \
      --no-warmup --json "$out/timeline_bench.json" >"$out/timeline_bench.log" 2>&1 || status=1
    for run in 0 1; do  # AsyncT, then Qwen3
      python3 bench/timeline_step.py "$out/timeline.csv" --run $run | tee "$out/timeline_run$run.txt" || status=1
    done
    rm -f "$out/timeline.csv"  # ~200k lines: the summaries above are what is kept
  else
    status=1
  fi
fi
if want prefill_profile; then
  # The Hopper prefill kernel beside cuDNN and a bf16 matmul under a sustained stream
  # (bench/prefill_clock.py: clock, power, clock-event reasons), then ncu with the source page summarised by the kernel's parts
  # (bench/ncu_source.py) for each of PROFILE_SHAPES. ASYNCT_* variables set for the call (e.g.
  # ASYNCT_PREFILL_CTAS) reach both. Everything comes back as one prefill-profile-HHMMSS.tgz.
  echo "== the prefill kernel: clock and power under a sustained stream; ncu and its source page =="
  PYTHONUNBUFFERED=1 timeout 120 python3 bench/prefill_clock.py --lib "$PWD/build/gpu" --out "$out" |
    tee "$out/prefill_clock.txt" || status=1
  for shape in ${PROFILE_SHAPES:-128x128 16x1024 1x16384}; do
    ncu_profile prefill_ncu prefill_hopper_kernel 1 2 bench_prefill.py "$shape" \
      "Duration|Compute \(SM\) Throughput|DRAM Throughput|L2 Hit Rate" || status=1
  done
  (cd "$out" && tar czf "prefill-profile-$(date +%H%M%S).tgz" prefill_clock.* prefill_ncu_* && rm -f prefill_clock.* prefill_ncu_*)
fi
if want decode_profile; then
  # The decode kernel over bf16 and e4m3 caches (both gates; bench_decode.py --profile) under
  # ncu, with the source page summarised by the kernel's parts, for each of DECODE_PROFILE_SHAPES.
  echo "== the decode kernel under ncu: async and softmax over bf16, then over e4m3 =="
  for shape in ${DECODE_PROFILE_SHAPES:-32x4096}; do
    ncu_profile decode_ncu decode_stage1 4 4 bench_decode.py "$shape" \
      "^  [a-z_]+.*decode_stage1|Duration|Compute \(SM\) Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" ||
      status=1
  done
  (cd "$out" && tar czf "decode-profile-$(date +%H%M%S).tgz" decode_ncu_* && rm -f decode_ncu_*)
fi
if want probes; then
  echo "== design probes =="
  mkdir -p build/gpu
  for probe in boundary_probe step_probe; do
    nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc "bench/$probe.cu" -o "build/gpu/$probe" &&
      timeout 120 "build/gpu/$probe" | tee "$out/$probe.txt" || status=1
  done
fi
# The device tool brings back only a few files: this run's logs go back as one archive.
if compgen -G "$out/*.log" >/dev/null; then
  (cd "$out" && tar czf "logs-$(date +%H%M%S).tgz" ./*.log && rm -f ./*.log)
fi
exit $status
