#!/usr/bin/env bash
# Fetches what structured output needs into a cache outside the repository (nothing of it is
# committed), and prints the cache's path:
#   $ASYNCT_CACHE (default ~/.cache/asynct)/xgrammar/xgrammar-0.2.8/   xgrammar's PyPI sdist
#       (sha256-checked), a C++ library the build compiles when -DASYNCT_XGRAMMAR_DIR names it
#       (CMakeLists.txt finds it here by default)
#   $ASYNCT_CACHE/python-jsonschema/   jsonschema and its dependencies, pinned, for the server test
#       (not with --build-only: what scripts/run.sh asks, the build needing only the sdist)
# Safe to run repeatedly: what is there and checks out is kept.
set -euo pipefail
build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}"
target="$cache/xgrammar"
sdist=xgrammar-0.2.8.tar.gz
sha=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
if [ ! -f "$target/xgrammar-0.2.8/CMakeLists.txt" ]; then
  mkdir -p "$target"
  if ! echo "$sha  $target/$sdist" | sha256sum -c --status 2>/dev/null; then
    echo "downloading xgrammar 0.2.8's sdist into $target" >&2
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # pip goes on to prepare the package's metadata (a build); only the download is needed, so
    # the file is taken from -d or, when that step fails or runs long, from pip's own unpack folder.
    TMPDIR="$tmp" timeout 180 python3 -m pip download -q --no-deps --no-binary :all: xgrammar==0.2.8 -d "$tmp/out" >&2 || true
    found="$(find "$tmp" -name "$sdist" | head -1)"
    [ -n "$found" ] || { echo "fetch_grammar_assets: pip did not download $sdist" >&2; exit 1; }
    cp "$found" "$target/$sdist"
  fi
  echo "$sha  $target/$sdist" | sha256sum -c --status || { echo "fetch_grammar_assets: $sdist fails its sha256" >&2; exit 1; }
  tar -xzf "$target/$sdist" -C "$target"
fi
if ((build_only)); then
  echo "$cache"
  exit 0
fi
json_target="$cache/python-jsonschema"
pins=(jsonschema==4.26.0 attrs==26.1.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
      typing_extensions==4.16.0)
if ! PYTHONPATH="$json_target" python3 -c "import jsonschema, sys; sys.exit(not jsonschema.__file__.startswith('$json_target'))" 2>/dev/null; then
  echo "installing jsonschema 4.26.0 into $json_target" >&2
  rm -rf "$json_target"
  python3 -m pip install -q --root-user-action=ignore --no-deps --target "$json_target" "${pins[@]}" >&2
  PYTHONPATH="$json_target" python3 -c "import jsonschema" || { echo "fetch_grammar_assets: jsonschema does not import from $json_target" >&2; exit 1; }
fi
echo "$cache"
