#include "kernels/decode.h"
