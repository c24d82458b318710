#!/usr/bin/env bash
# A kernel benchmark of this tree against an earlier commit, in one GPU call: figures move by up
# to ~7% from one machine to the next, so a change is judged only against the tree before it
# measured beside it.
#
#   scripts/ab_bench.sh prepare REV    here (with git): REV's files into build/ab/REV (~3 MB);
#                                      carry build/ab on the GPU machine (it has no git history)
#   scripts/ab_bench.sh run REV [BENCH [ARGS...]]
#                                      on the GPU machine, after scripts/gpu_check.sh built this
#                                      tree into build/gpu: builds REV's library into
#                                      build/ab/REV/build (asynct_c only, ~60 s on 16 cores), then
#                                      runs bench/bench_BENCH.py (default: prefill) with ARGS for
#                                      this tree, REV, and this tree again (the spread within the
#                                      call), each writing into $OUT/ab/{this,REV,this-again}
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
rev="${2:-}"
[[ "$mode" == prepare || "$mode" == run ]] && [[ -n "$rev" ]] || {
  sed -n '2,15p' "$0" >&2
  exit 2
}
tree="build/ab/$rev"

if [[ "$mode" == prepare ]]; then
  git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "ab_bench: no commit $rev here" >&2; exit 2; }
  rm -rf "$tree" && mkdir -p "$tree"
  git archive "$rev" | tar -x -C "$tree"
  echo "ab_bench: $rev in $tree ($(du -sh "$tree" | cut -f1)); carry build/ab"
  exit 0
fi

bench="${3:-prefill}"
shift $(($# < 3 ? $# : 3))
[[ -d "$tree" ]] || { echo "ab_bench: $tree is missing (scripts/ab_bench.sh prepare $rev, then carry build/ab)" >&2; exit 2; }
[[ -f build/gpu/lib/libasynct.so ]] || { echo "ab_bench: build this tree first (scripts/gpu_check.sh)" >&2; exit 2; }
out="${OUT:-build/gpu-out}/ab"
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
prefix=()
[[ -d .deps/root/usr ]] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
echo "== ab_bench: building $rev's library"
cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DASYNCT_CUDA=ON -DASYNCT_TEXT=OFF \
  -DASYNCT_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a" "${prefix[@]}" >"$out/configure_$rev.log" 2>&1 ||
  { tail -20 "$out/configure_$rev.log"; exit 1; }
cmake --build "$tree/build" --target asynct_c -j "$(nproc)" >"$out/build_$rev.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$out/build_$rev.log" | head -40; exit 1; }
(cd bench && timeout 60 python3 ceilings.py --json "$out/ceilings.json") >/dev/null
for run in this "$rev" this-again; do
  dir="$out/$run"
  mkdir -p "$dir" && cp "$out/ceilings.json" "$dir/"
  if [[ "$run" == "$rev" ]]; then root="$tree" lib="$PWD/$tree/build"; else root=. lib="$PWD/build/gpu"; fi
  echo "== ab_bench: $bench, $run"
  PYTHONUNBUFFERED=1 timeout 300 python3 "$root/bench/bench_$bench.py" --lib "$lib" --out "$dir" "$@"
done
