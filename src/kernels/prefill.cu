// Placeholder: the implementation lands with the CUDA kernels work.
#include "kernels/prefill.h"
