#!/usr/bin/env bash
# The CPU backend's prompt and generation rates on a checkpoint, as `asynct generate` runs them,
# beside the host's memory read rate (the ceiling of a decode step):
#   prompt tokens/s     = P / (time of a P-token prompt and 1 generated token)
#   generated tokens/s  = (G - 1) / (time of P + G tokens - time of P + 1)
# Each figure is the best of R runs (the machine may be shared: say so beside any figure).
#
#   bench/cpu_generate_rates.sh BUILD_DIR MODEL_DIR [P=512] [G=128] [R=3] [asynct options, e.g. --cpu-reference]
set -euo pipefail
build=${1:?build directory (e.g. build/cpu)}
model=${2:?checkpoint directory}
prompt=${3:-512}
gen=${4:-128}
runs=${5:-3}
shift $(( $# < 5 ? $# : 5 ))
ids=$(python3 -c "import random; r = random.Random(1); print(','.join(str(r.randrange(100, 40000)) for _ in range($prompt)))")
seconds() {  # seconds of the engine's steps for MAX_TOKENS [options], best of $runs
  local max_tokens=$1 best="" s
  shift
  for _ in $(seq "$runs"); do
    s=$("$build/src/asynct" generate --model "$model" --device cpu --prompt-ids "$ids" --max-tokens "$max_tokens" \
          --ignore-eos "$@" 2>&1 | sed -n 's/.* tokens in \([0-9.]*\) s .*/\1/p')
    [ -n "$s" ] || { echo "asynct generate printed no time" >&2; exit 1; }
    best=$(python3 -c "print(min($s, ${best:-$s}))")
  done
  echo "$best"
}
"$build/bench/asynct_cpu_memory_rate" 1024 "${ASYNCT_THREADS:-$(nproc)}" 10
one=$(seconds 1 "$@")
all=$(seconds "$gen" "$@")
python3 - "$prompt" "$gen" "$one" "$all" <<'PY'
import sys
p, g, one, total = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"prompt {p}: {p / one:.1f} tokens/s ({one:.3f} s); generated {g}: {(g - 1) / (total - one):.1f} tokens/s "
      f"({(total - one) / (g - 1) * 1e3:.2f} ms a token)")
PY
"$build/bench/asynct_cpu_memory_rate" 1024 "${ASYNCT_THREADS:-$(nproc)}" 10
