// Forwarding header: moved to models/cpu/cpu_model_runner.h. Kept only until every #include names the new path;
// delete it then.
#pragma once

#include "models/cpu/cpu_model_runner.h"
