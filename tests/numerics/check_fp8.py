#!/usr/bin/env python3
"""asynct's e4m3 conversions (core/fp8.h) against ml_dtypes' float8_e4m3fn, the reference
implementation JAX and others use:

    python3 tests/numerics/check_fp8.py --encoder build/release/tests/numerics/asynct_fp8_encode \\
        --python ~/.cache/asynct/python-numerics

Checked: every one of the 256 patterns decodes to ml_dtypes' value (NaN where it has NaN); every
float32 tested encodes to ml_dtypes' byte once clamped to [-448, 448] (asynct saturates, as the
GPU's satfinite conversion does, where ml_dtypes overflows to NaN): each e4m3 value, each midpoint
between neighbours and one float32 step either side of it, both signs, and a million random
float32 patterns over every exponent; infinities saturate to +-448, NaN stays NaN.
Exit 77 (skipped) without ml_dtypes (scripts/fetch_numerics_assets.sh).
"""
import argparse
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", required=True)
    parser.add_argument("--python", required=True, help="where numpy and ml_dtypes are")
    args = parser.parse_args()
    sys.path.insert(0, args.python)
    try:
        import ml_dtypes
        import numpy as np
    except ImportError:
        print(f"skipped: no numpy / ml_dtypes at {args.python} (scripts/fetch_numerics_assets.sh)")
        sys.exit(77)
    e4m3 = ml_dtypes.float8_e4m3fn

    patterns = np.arange(256, dtype=np.uint8)
    grid = patterns.view(e4m3).astype(np.float32)
    finite = grid[np.isfinite(grid)]
    ordered = np.unique(finite)  # ascending, -0 and 0 once
    mids = (ordered[:-1] + ordered[1:]) / 2
    values = [finite, mids, np.nextafter(mids, np.float32(-np.inf)), np.nextafter(mids, np.float32(np.inf))]
    rng = np.random.default_rng(7)
    values.append(rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32))
    values.append(np.array([np.inf, -np.inf, np.nan, 448, -448, 464, 480, 1e30, 2.0**-10, 2.0**-11, -(2.0**-10)],
                           dtype=np.float32))
    x = np.concatenate(values).astype(np.float32)

    out = subprocess.run([args.encoder], input=x.tobytes(), capture_output=True, check=True).stdout
    got = np.frombuffer(out[: x.size], dtype=np.uint8)
    decoded = np.frombuffer(out[x.size:], dtype=np.float32)

    failures = 0
    same = (decoded == grid) | (np.isnan(decoded) & np.isnan(grid))
    same &= np.signbit(decoded) == np.signbit(grid)  # -0 and 0 apart
    print(f"{'ok  ' if same.all() else 'FAIL'} the 256 patterns decode as ml_dtypes decodes them")
    failures += not same.all()

    nan = np.isnan(x)
    clamped = np.clip(np.where(nan, 0, x), -448, 448).astype(np.float32)
    want = clamped.astype(e4m3).view(np.uint8)
    is_nan_byte = (got & 0x7F) == 0x7F
    match = np.where(nan, is_nan_byte, got == want)
    bad = np.flatnonzero(~match)
    print(f"{'ok  ' if bad.size == 0 else 'FAIL'} {x.size} float32 values encode as ml_dtypes encodes them clamped to +-448"
          + ("" if bad.size == 0 else f": first {x[bad[0]]!r} (bits {x[bad[0]:bad[0]+1].view(np.uint32)[0]:#010x}) -> "
                                      f"{got[bad[0]]:#04x}, ml_dtypes {want[bad[0]]:#04x}"))
    failures += bad.size != 0
    print("all passed" if not failures else f"{failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
