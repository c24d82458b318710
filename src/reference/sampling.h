// Forwarding header: moved to engine/sampler.h. Kept only until every #include names the new path;
// delete it then.
#pragma once

#include "engine/sampler.h"
