// Ranks as forked processes over one FileStore, for the checks that need a
// process of their own per rank: CUDA does not survive fork(), so the test
// process itself never touches CUDA and every rank that does is a child;
// and a rank that "dies" or restarts is a real process. Used by
// comm_nccl_test.cc and elastic_backend_test.cc.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "omni/config.h"
#include "omni/store.h"

#if OMNI_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace omni::test_util {

inline constexpr int kSkipCode = 77;  // a forked check that found nothing to test

// A directory on /dev/shm when it is writable (the FileStore polls it), else
// under the temporary directory; removed with its contents.
class ShmDir {
 public:
  ShmDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm")
                              : fs::temp_directory_path();
    std::string tmpl = (base / "omni_fork_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ShmDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ShmDir(const ShmDir&) = delete;
  ShmDir& operator=(const ShmDir&) = delete;
  const std::string& path() const { return path_; }
  std::string StoreUri() const { return "file://" + path_ + "/store"; }

 private:
  std::string path_;
};

struct Outcome {
  int code = -1;  // exit code; -1 when killed or hung
  std::string message;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `body(rank, store)` in `n` forked processes sharing the FileStore of
// `dir` (its StoreUri: several calls on one dir share the store, e.g. a
// replica and its restart); the body returns "" on success, "skip: why" to
// skip, else what went wrong. Ranks still running after `limit` are killed
// and reported as hung.
inline std::vector<Outcome> ForkIn(const ShmDir& dir, int n,
                                   const std::function<std::string(int, Store&)>& body,
                                   absl::Duration limit = absl::Seconds(120)) {
  std::vector<pid_t> pids;
  const std::string tag = absl::StrCat(dir.path(), "/outcome-", absl::ToUnixNanos(absl::Now()));
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      absl::StatusOr<std::unique_ptr<Store>> store = OpenStore(dir.StoreUri());
      std::string msg = store.ok() ? body(r, **store) : store.status().ToString();
      std::ofstream(absl::StrCat(tag, "-", r)) << msg;
      ::_exit(msg.empty() ? 0 : msg.rfind("skip:", 0) == 0 ? kSkipCode : 1);
    }
    pids.push_back(pid);
  }
  std::vector<Outcome> out(static_cast<size_t>(n));
  const absl::Time deadline = absl::Now() + limit;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(pids[r], &status, WNOHANG)) == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (got == 0) {
      ::kill(pids[r], SIGKILL);
      ::waitpid(pids[r], nullptr, 0);
      out[r].message = absl::StrCat("rank ", r, " hung");
      continue;
    }
    out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    out[r].message = Slurp(absl::StrCat(tag, "-", r));
    if (WIFSIGNALED(status)) absl::StrAppend(&out[r].message, " (signal ", WTERMSIG(status), ")");
  }
  return out;
}

// ForkIn on a directory of its own.
inline std::vector<Outcome> Fork(int n, const std::function<std::string(int, Store&)>& body,
                                 absl::Duration limit = absl::Seconds(120)) {
  ShmDir dir;
  return ForkIn(dir, n, body, limit);
}

#define RANK_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) return absl::StrCat("rank ", rank, ": ", #cond, ": ", __VA_ARGS__); \
  } while (false)

#if OMNI_HAVE_NCCL

// The number of CUDA devices, asked in a child so that this process never
// initializes CUDA (it could not fork usable children afterwards).
inline int DeviceCount() {
  const std::vector<Outcome> out = Fork(1, [](int, Store&) -> std::string {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    return n == 0 ? "skip: no CUDA device" : absl::StrCat("devices=", n);
  });
  const std::string& m = out[0].message;
  return m.rfind("devices=", 0) == 0 ? std::stoi(m.substr(8)) : 0;
}

// Device memory for a test, copied from / back to the host.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    if (cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_ != nullptr) cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(p_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  T* get() const { return static_cast<T*>(p_); }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  size_t n_;
  void* p_ = nullptr;
};

#else

inline int DeviceCount() { return 0; }

#endif  // OMNI_HAVE_NCCL

}  // namespace omni::test_util
