// A FileSystem that passes every operation to the operating system's, for
// tests that interpose on one or two of them (override those; call
// PassThroughFileSystem's to go on).
//
// Thread safety: as the real file system's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/fs.h"

namespace omni::testing {

class PassThroughFileSystem : public internal::FileSystem {
 public:
  absl::StatusOr<internal::Fd> OpenDir(int dir, const std::string& name,
                                       const std::string& path) override {
    return real_.OpenDir(dir, name, path);
  }
  absl::StatusOr<internal::Fd> OpenWrite(int dir, const std::string& name, bool truncate,
                                         bool exclusive, const std::string& path) override {
    return real_.OpenWrite(dir, name, truncate, exclusive, path);
  }
  absl::StatusOr<internal::Fd> OpenRead(int dir, const std::string& name,
                                        const std::string& path) override {
    return real_.OpenRead(dir, name, path);
  }
  absl::StatusOr<internal::FileStat> Stat(int dir, const std::string& name,
                                          const std::string& path) override {
    return real_.Stat(dir, name, path);
  }
  absl::Status Write(int fd, const void* data, size_t n, uint64_t offset,
                     const std::string& path) override {
    return real_.Write(fd, data, n, offset, path);
  }
  absl::Status Sync(int fd, const std::string& path) override { return real_.Sync(fd, path); }
  absl::Status Rename(int from_dir, const std::string& from, int to_dir, const std::string& to,
                      bool exchange, const std::string& path) override {
    return real_.Rename(from_dir, from, to_dir, to, exchange, path);
  }
  absl::Status Remove(int dir, const std::string& name, bool directory,
                      const std::string& path) override {
    return real_.Remove(dir, name, directory, path);
  }
  absl::Status Mkdir(int dir, const std::string& name, const std::string& path) override {
    return real_.Mkdir(dir, name, path);
  }
  absl::StatusOr<std::vector<internal::DirEntry>> List(int dir, const std::string& path) override {
    return real_.List(dir, path);
  }

 private:
  internal::FileSystem& real_ = internal::RealFileSystem();
};

}  // namespace omni::testing
