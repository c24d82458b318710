#!/usr/bin/env bash
# Fetches the numerics tests' reference packages (numpy and ml_dtypes, whose float8_e4m3fn the
# FP8 conversions are checked against) into a cache outside the repository, and prints their
# folder: $ASYNCT_CACHE (default ~/.cache/asynct)/python-numerics. Pinned versions from PyPI;
# safe to run repeatedly: what is there and imports at those versions is kept.
set -euo pipefail
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}"
target="$cache/python-numerics"
if ! PYTHONPATH="$target" python3 -c "import numpy, ml_dtypes; assert numpy.__version__ == '2.2.6' and ml_dtypes.__version__ == '0.5.1'" 2>/dev/null; then
  echo "installing numpy 2.2.6 and ml_dtypes 0.5.1 into $target" >&2
  mkdir -p "$cache"
  python3 -m pip install -q --root-user-action=ignore --no-deps --upgrade --target "$target" numpy==2.2.6 ml_dtypes==0.5.1 >&2
fi
echo "$target"
