#!/usr/bin/env bash
# The GPU machine has the CUDA toolkit, CMake and PyTorch but not the C++ libraries asynct's
# tests, text support and server build with, and it cannot install anything. This downloads their
# Debian packages into .deps/ (ignored by git, ~28 MB) so that scripts/gpu_check.sh can unpack
# them there: GoogleTest, nlohmann-json, CLI11; PCRE2 and ICU (text); cpp-httplib with the
# headers and libraries its pkg-config file asks for (OpenSSL, zlib, brotli); pkgconf to find them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
rm -f ./*.deb
apt-get download -qq libgtest-dev googletest nlohmann-json3-dev libcli11-dev \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72 \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1 \
  pkgconf pkgconf-bin libpkgconf3
ls -1 ./*.deb
