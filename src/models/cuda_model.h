// Forwarding header: moved to models/cuda/cuda_model_runner.h. Kept only until every #include names the new path;
// delete it then.
#pragma once

#include "models/cuda/cuda_model_runner.h"
