# Sourced by the scripts: puts a CUDA toolkit installed in the usual place on PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export CMAKE_GENERATOR=Ninja
