#include "omni/version.h"

#include "absl/strings/str_cat.h"
#include "omni/nccl.h"

namespace omni {

const char* Version() { return OMNI_VERSION_STRING; }

std::string BuildInfo() {
  std::string nccl = "no";
  if (OMNI_HAVE_NCCL) {
    const int v = NcclLibraryVersion();
    nccl = absl::StrCat("yes (library ", v / 10000, ".", (v / 100) % 100, ".", v % 100, ")");
  }
  return absl::StrCat("omni ", Version(), " gloo=", OMNI_HAVE_GLOO ? "yes" : "no", " nccl=", nccl);
}

}  // namespace omni
