#!/usr/bin/env bash
# Installs the Debian packages asynct builds with, if any is missing. Safe to run repeatedly.
set -euo pipefail

packages=(cmake ninja-build g++ ccache libgtest-dev nlohmann-json3-dev libcli11-dev pkg-config libpcre2-dev libicu-dev libcpp-httplib-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "asynct setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "asynct setup: nvcc is at /usr/local/cuda/bin (add it to PATH to skip this note)"
fi
