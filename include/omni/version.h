// Library version and build configuration, as compiled.
#pragma once

#include <string>

#include "omni/config.h"
#include "omni/export.h"

namespace omni {

// "MAJOR.MINOR.PATCH" of the library that is linked (not the headers).
OMNI_EXPORT const char* Version();

// One line describing the build: version, Gloo and NCCL availability.
OMNI_EXPORT std::string BuildInfo();

}  // namespace omni
