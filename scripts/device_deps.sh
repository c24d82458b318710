#!/usr/bin/env bash
# The GPU machine has the CUDA toolkit, CMake and PyTorch but not the C++ libraries asynct's
# tests build with, and it cannot install anything. This downloads their Debian packages into
# .deps/ (ignored by git) so that scripts/gpu_check.sh can unpack them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
rm -f ./*.deb
apt-get download -qq libgtest-dev googletest nlohmann-json3-dev libcli11-dev
ls -1 ./*.deb
