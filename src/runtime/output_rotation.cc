#include "runtime/output_rotation.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fs.h"

namespace omni::internal {
namespace {

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<std::string> MoveAside(const std::string& path) {
  if (!Exists(path)) return std::string();
  for (int n = 1; n < 1'000'000; ++n) {
    const std::string to = absl::StrCat(path, ".", n);
    if (Exists(to)) continue;
    if (std::rename(path.c_str(), to.c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("cannot move the previous run's ", path, " to ", to));
    }
    return to;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot move the previous run's ", path, " aside: every name is taken"));
}

}  // namespace omni::internal
