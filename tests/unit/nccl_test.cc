#include "omni/nccl.h"

#include <gtest/gtest.h>

#include "omni/version.h"

namespace omni {
namespace {

TEST(NcclProbe, ReportsTheLinkedLibraryOrAClearNoDeviceError) {
  auto info = ProbeNccl();
  if (!OMNI_HAVE_NCCL) {
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  EXPECT_GE(NcclLibraryVersion(), 21800);
  if (info.ok()) {
    EXPECT_GT(info->cuda_devices, 0);
    EXPECT_EQ(info->supports_shrink, info->runtime_version >= 22700);
  } else {
    // A host without a GPU (like CI): a clear error, not a crash or a hang.
    EXPECT_EQ(info.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(info.status().message().find("no CUDA device"), absl::string_view::npos)
        << info.status();
  }
}

TEST(BuildInfo, NamesVersionAndBackends) {
  const std::string s = BuildInfo();
  EXPECT_NE(s.find(Version()), std::string::npos);
  EXPECT_NE(s.find("gloo="), std::string::npos);
  EXPECT_NE(s.find("nccl="), std::string::npos);
}

}  // namespace
}  // namespace omni
