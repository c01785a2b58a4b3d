// Checkpoint save / restore throughput against the physical limit and against
// torch::save / torch::load, measured side by side in one run.
//
//   save_vs_raw          raw write+fsync time / omni Save time (same bytes, same disk)
//   restore_vs_raw       raw read time / omni Restore time (one pass: read into the
//                        tensors, every checksum verified), both from the disk (page
//                        cache dropped with POSIX_FADV_DONTNEED)
//   save_vs_torch_save   torch::save time / omni Save time (>= 1: never slower)
//   save_peak_extra_mib  peak RSS during a Save beyond the state itself
//   async_stall_vs_memcpy  training-thread stall of SaveAsync / memcpy of the same bytes
//                        (median; the first snapshot also faults its host memory in,
//                        reported separately as async_first_stall_s)
//
// Usage: bench_checkpoint [MiB=1024] [dir=build/bench/ckpt]
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "omni/checkpoint.h"
#include "omni/torch/state.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long StatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + std::strlen(field));
  }
  return -1;
}

void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

// A module holding `mib` MiB of float parameters in 64 MiB tensors.
struct Big : torch::nn::Module {
  explicit Big(int64_t mib) {
    const int64_t per = 16 << 20;  // floats per 64 MiB tensor
    for (int64_t i = 0; i * 64 < mib; ++i) {
      const int64_t n = std::min<int64_t>(per, (mib - i * 64) * (1 << 18));
      register_parameter("w" + std::to_string(i), torch::randn({n}));
    }
  }
};

double RawWrite(const std::string& path, const std::vector<torch::Tensor>& ts) {
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const auto& t : ts) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n <= 0) std::abort();
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
  return Now() - t0;
}

// Drops the clean pages of every file under `root` from the page cache, so
// that reads come from the disk (the physical limit) for both contenders.
void EvictPageCache(const std::string& root) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double RawRead(const std::string& path, std::vector<torch::Tensor>& ts) {
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  for (auto& t : ts) {
    char* p = static_cast<char*>(t.data_ptr());
    size_t left = t.nbytes();
    while (left > 0) {
      const ssize_t n = ::read(fd, p, left);
      if (n <= 0) std::abort();
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return Now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024;
  const std::string dir = argc > 2 ? argv[2] : "build/bench/ckpt";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  Big big(mib);
  std::vector<torch::Tensor> params;
  for (auto& p : big.parameters()) params.push_back(p.detach());
  size_t bytes = 0;
  for (auto& p : params) bytes += p.nbytes();
  omni::torch_ext::ModuleState state_obj(big);
  omni::StateRegistry reg;
  if (!reg.Register("model", &state_obj).ok()) return 1;
  omni::CheckpointOptions co;
  co.dir = dir + "/omni";
  co.keep_last = 1000;  // retention's deletions would run during the next timing
  auto mgr = omni::CheckpointManager::Open(co);
  if (!mgr.ok()) {
    std::fprintf(stderr, "%s\n", std::string(mgr.status().message()).c_str());
    return 1;
  }

  const int trials = 5;
  std::vector<double> raw_w, raw_r, save, restore, tsave, stall, memcpy_s;
  long peak_extra_kb = 0;
  std::vector<char> copy_dst(bytes);
  for (int t = 0; t < trials; ++t) {
    raw_w.push_back(RawWrite(dir + "/raw.bin", params));
    const long rss0 = StatusKb("VmRSS:");
    ResetPeakRss();
    double t0 = Now();
    auto s = (*mgr)->Save(t + 1, reg, {});
    save.push_back(Now() - t0);
    if (!s.ok()) {
      std::fprintf(stderr, "save: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    peak_extra_kb = std::max(peak_extra_kb, StatusKb("VmHWM:") - rss0);
    // Cold reads of both, in alternating order (the disk is shared and noisy).
    for (int k = 0; k < 2; ++k) {
      EvictPageCache(dir);
      if ((k + t) % 2 == 0) {
        raw_r.push_back(RawRead(dir + "/raw.bin", params));
        continue;
      }
      t0 = Now();
      auto r = (*mgr)->Restore(reg);
      restore.push_back(Now() - t0);
      if (!r.ok()) {
        std::fprintf(stderr, "restore: %s\n", std::string(r.status().message()).c_str());
        return 1;
      }
    }
    t0 = Now();
    torch::save(params, dir + "/torch.pt");
    {
      const int fd = ::open((dir + "/torch.pt").c_str(), O_RDONLY);
      ::fsync(fd);  // torch::save does not fsync; durability is part of the job
      ::close(fd);
    }
    tsave.push_back(Now() - t0);
    // Async: the stall is the snapshot copy; compare with a plain memcpy.
    t0 = Now();
    size_t off = 0;
    for (auto& p : params) {
      std::memcpy(copy_dst.data() + off, p.data_ptr(), p.nbytes());
      off += p.nbytes();
    }
    memcpy_s.push_back(Now() - t0);
    auto a = (*mgr)->SaveAsync(100 + t, reg, {});
    if (!a.ok()) {
      std::fprintf(stderr, "save async: %s\n", std::string(a.status().message()).c_str());
      return 1;
    }
    stall.push_back(a->snapshot_s);
    std::printf("trial %d: async stall %.3f s, memcpy %.3f s; raw read %.3f s, restore %.3f s\n", t,
                a->snapshot_s, memcpy_s.back(), raw_r.back(), restore.back());
    if (!(*mgr)->WaitForPending().ok()) return 1;
    // Free the disk space outside the timed regions (both contenders write
    // into fresh files).
    for (const auto& e : std::filesystem::directory_iterator(co.dir)) {
      if (e.path().filename().string().rfind("step-", 0) == 0)
        std::filesystem::remove_all(e.path(), ec);
    }
    std::filesystem::remove(dir + "/raw.bin", ec);
    std::filesystem::remove(dir + "/torch.pt", ec);
    ::sync();
  }
  const auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double gib = static_cast<double>(bytes) / (1 << 30);
  std::printf("state %.2f GiB in %zu tensors, %d trials (medians)\n", gib, params.size(), trials);
  std::printf("raw write+fsync %.2f GiB/s, omni save %.2f GiB/s, torch::save+fsync %.2f GiB/s\n",
              gib / med(raw_w), gib / med(save), gib / med(tsave));
  std::printf("raw read (cold) %.2f GiB/s, omni restore (verified load, cold) %.2f GiB/s\n",
              gib / med(raw_r), gib / med(restore));
  std::printf("async stall %.3f s, memcpy %.3f s\n", med(stall), med(memcpy_s));
  std::printf(
      "{\"benchmark\":\"checkpoint\",\"state_gib\":%.3f,\"save_vs_raw\":%.3f,\"restore_vs_raw\":%."
      "3f,"
      "\"save_vs_torch_save\":%.3f,\"save_peak_extra_mib\":%.1f,\"async_stall_vs_memcpy\":%.3f,"
      "\"async_first_stall_s\":%.3f}\n",
      gib, med(raw_w) / med(save), med(raw_r) / med(restore), med(tsave) / med(save),
      static_cast<double>(peak_extra_kb) / 1024.0, med(stall) / med(memcpy_s), stall.front());
  mgr->reset();  // joins the writer before the files go
  std::filesystem::remove_all(dir, ec);
  return 0;
}
