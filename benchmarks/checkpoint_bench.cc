// Checkpoint save / restore throughput against the physical limit and against
// torch::save / torch::load, measured side by side in one run.
//
//   save_vs_raw          raw write+fsync time / omni Save time (same bytes, same disk)
//   restore_vs_raw       raw read time / omni Restore time (one pass: read into the
//                        tensors, every checksum verified), both from the disk (page
//                        cache dropped with POSIX_FADV_DONTNEED)
//   save_vs_direct       omni Save throughput / the best streaming O_DIRECT write+fsync
//                        of the same bytes (block sizes and queue depths probed once,
//                        the fastest kept; null with the reason without O_DIRECT)
//   save_vs_torch_save   torch::save time / omni Save time (>= 1: never slower)
//   save_peak_extra_mib  peak RSS during the process's first Save beyond the state itself
//   async_stall_vs_memcpy  training-thread stall of SaveAsync / memcpy of the same bytes
//                        into memory already touched (as a re-used snapshot's is); the
//                        first snapshot also faults its host memory in, reported
//                        separately as async_first_stall_s
//
// The disk (and the memory bandwidth) of a shared machine drift by tens of
// percent within seconds, so every ratio is the median of per-pair ratios: each
// omni measurement is paired with the adjacent measurement of its baseline,
// taken in alternating order (A B, then B A), and the pairs' ratios are
// reduced with a median. *_min / *_max give the spread of the pairs.
//
// Usage: bench_checkpoint [MiB=1024] [dir=build/bench/ckpt] [trials=7] [direct_io]
// (direct_io 1: omni saves with O_DIRECT, 0: through the page cache; default:
// CheckpointOptions::direct_io's)
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
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

// The same bytes streamed with O_DIRECT (no page cache): the tensors are
// copied into `depth` aligned `block`-byte buffers, one writer thread per
// buffer, each writing every depth-th block at its offset (depth 1 is a plain
// sequential stream), then fsync. A final partial block is padded to the
// alignment and the file cut back to `bytes`. Returns the time, or -errno.
struct DirectConfig {
  size_t block = 0;
  int depth = 1;
};

constexpr size_t kDirectAlign = 4096;

// Copies [off, off + len) of the tensors' concatenated bytes into dst.
void CopyRange(const std::vector<torch::Tensor>& ts, size_t off, size_t len, char* dst) {
  for (const auto& t : ts) {
    if (len == 0) return;
    const size_t n = t.nbytes();
    if (off >= n) {
      off -= n;
      continue;
    }
    const size_t take = std::min(len, n - off);
    std::memcpy(dst, static_cast<const char*>(t.data_ptr()) + off, take);
    dst += take;
    len -= take;
    off = 0;
  }
}

double DirectWrite(const std::string& path, const std::vector<torch::Tensor>& ts, size_t bytes,
                   const DirectConfig& cfg) {
  struct Buffer {
    void* p = nullptr;
    ~Buffer() { std::free(p); }  // NOLINT(cppcoreguidelines-no-malloc): posix_memalign's
  };
  std::vector<Buffer> bufs(static_cast<size_t>(cfg.depth));
  for (auto& b : bufs) {
    if (::posix_memalign(&b.p, kDirectAlign, cfg.block) != 0) return -ENOMEM;
    std::memset(b.p, 0, cfg.block);  // faulted in outside the timing
  }
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return -errno;
  const size_t blocks = (bytes + cfg.block - 1) / cfg.block;
  std::vector<int> errs(bufs.size(), 0);
  const auto writer = [&](size_t k) {
    char* buf = static_cast<char*>(bufs[k].p);
    for (size_t i = k; i < blocks && errs[k] == 0; i += bufs.size()) {
      const size_t off = i * cfg.block;
      const size_t len = std::min(cfg.block, bytes - off);
      CopyRange(ts, off, len, buf);
      const size_t padded = (len + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      std::memset(buf + len, 0, padded - len);
      size_t done = 0;
      while (done < padded) {
        const ssize_t n = ::pwrite(fd, buf + done, padded - done, static_cast<off_t>(off + done));
        if (n <= 0) {
          errs[k] = n < 0 ? errno : EIO;
          break;
        }
        done += static_cast<size_t>(n);
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t k = 1; k < bufs.size(); ++k) threads.emplace_back(writer, k);
  writer(0);
  for (auto& th : threads) th.join();
  int err = 0;
  for (const int e : errs) err = err != 0 ? err : e;
  if (err == 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) err = errno;
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  ::close(fd);
  return err != 0 ? -err : Now() - t0;
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

// Median of per-pair ratios (the mean of the two middle ones for an even count).
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

double Median(std::vector<double> v) { return Summarize(std::move(v)).median; }

double Memcpy(const std::vector<torch::Tensor>& ts, std::vector<char>& dst) {
  const double t0 = Now();
  size_t off = 0;
  for (const auto& t : ts) {
    std::memcpy(dst.data() + off, t.data_ptr(), t.nbytes());
    off += t.nbytes();
  }
  return Now() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024;
  const std::string dir = argc > 2 ? argv[2] : "build/bench/ckpt";
  const int trials = argc > 3 ? std::max(1, std::atoi(argv[3])) : 7;
  const bool direct_io = argc > 4 ? std::atoi(argv[4]) != 0 : omni::CheckpointOptions().direct_io;
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
  co.direct_io = direct_io;
  auto mgr = omni::CheckpointManager::Open(co);
  if (!mgr.ok()) {
    std::fprintf(stderr, "%s\n", std::string(mgr.status().message()).c_str());
    return 1;
  }
  // Frees the disk space outside the timed regions (every contender writes
  // into fresh files).
  const auto clean = [&] {
    for (const auto& e : std::filesystem::directory_iterator(co.dir)) {
      if (e.path().filename().string().rfind("step-", 0) == 0) {
        std::filesystem::remove_all(e.path(), ec);
      }
    }
    std::filesystem::remove(dir + "/raw.bin", ec);
    std::filesystem::remove(dir + "/torch.pt", ec);
    std::filesystem::remove(dir + "/direct.bin", ec);
    ::sync();
  };

  const auto torch_save = [&] {
    const double t0 = Now();
    torch::save(params, dir + "/torch.pt");
    const int fd = ::open((dir + "/torch.pt").c_str(), O_RDONLY);
    ::fsync(fd);  // torch::save does not fsync; durability is part of the job
    ::close(fd);
    return Now() - t0;
  };

  // The memory a save needs beyond the state: measured on the very first
  // Save of the process, before anything else has grown the heap.
  long peak_extra_kb = 0;
  {
    const long rss0 = StatusKb("VmRSS:");
    ResetPeakRss();
    auto s = (*mgr)->Save(1, reg, {});
    if (!s.ok()) {
      std::fprintf(stderr, "save: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    peak_extra_kb = StatusKb("VmHWM:") - rss0;
    clean();
  }

  // The first snapshot maps and faults in its host memory; later ones re-use
  // it (keep_snapshot_memory). It is reported on its own, outside the pairs.
  std::vector<char> copy_dst(bytes);  // zero-filled: touched, like re-used snapshot memory
  Memcpy(params, copy_dst);
  double first_stall = 0;
  {
    auto a = (*mgr)->SaveAsync(2, reg, {});
    if (!a.ok()) {
      std::fprintf(stderr, "save async: %s\n", std::string(a.status().message()).c_str());
      return 1;
    }
    first_stall = a->snapshot_s;
    if (!(*mgr)->WaitForPending().ok()) return 1;
    clean();
  }

  // The best streaming O_DIRECT write: a few block sizes and queue depths,
  // one probe each, the fastest kept for the pairs. A file system without
  // O_DIRECT (tmpfs: EINVAL) gets no figure, with the reason.
  DirectConfig direct;
  std::string direct_reason;
  {
    const DirectConfig configs[] = {
        {1 << 20, 1}, {8 << 20, 1}, {32 << 20, 1}, {8 << 20, 4}, {32 << 20, 4}};
    double best = 0;
    for (const auto& c : configs) {
      const double d = DirectWrite(dir + "/direct.bin", params, bytes, c);
      clean();
      if (d < 0) {
        direct_reason = std::string("O_DIRECT write of ") + std::to_string(c.block >> 20) +
                        " MiB blocks failed: " + std::strerror(static_cast<int>(-d));
        direct = {};
        break;
      }
      std::printf("O_DIRECT probe: %zu MiB blocks, queue depth %d: %.3f s\n", c.block >> 20,
                  c.depth, d);
      if (best == 0 || d < best) {
        best = d;
        direct = c;
      }
    }
  }
  const bool have_direct = direct.block != 0;

  const int read_pairs_per_trial = 2;
  std::vector<double> raw_w, raw_r, save, restore, tsave, stall, memcpy_s;
  std::vector<double> save_ratio, torch_ratio, restore_ratio, stall_ratio;
  std::vector<double> direct_w, direct_ratio;
  int64_t step = 3;
  for (int t = 0; t < trials; ++t) {
    const bool baseline_first = t % 2 == 0;
    // Save: two pairs, each adjacent and in alternating order: raw
    // write+fsync with an omni Save, then torch::save+fsync with another
    // (a write right after another 1 GiB write is often throttled, so every
    // contender takes the second place equally often).
    const auto omni_save = [&]() -> double {
      const double t0 = Now();
      auto s = (*mgr)->Save(step++, reg, {});
      if (!s.ok()) {
        std::fprintf(stderr, "save: %s\n", std::string(s.status().message()).c_str());
        return -1.0;
      }
      return Now() - t0;
    };
    // First pair: the best O_DIRECT stream with an omni Save, in alternating
    // order, right after a clean (a buffered save that follows other 1 GiB
    // writes without one ran 2-4x slower while O_DIRECT did not, which would
    // bias this pair); then a clean again, so the older pairs keep their
    // conditions.
    double dw = 0;
    double sv3 = 0;
    for (int k = 0; have_direct && k < 2; ++k) {
      if ((k == 0) == baseline_first) {
        dw = DirectWrite(dir + "/direct.bin", params, bytes, direct);
      } else {
        sv3 = omni_save();
      }
    }
    if (sv3 < 0) return 1;
    if (dw < 0) {
      std::fprintf(stderr, "O_DIRECT write: %s\n", std::strerror(static_cast<int>(-dw)));
      return 1;
    }
    if (have_direct) {
      direct_w.push_back(dw);
      direct_ratio.push_back(dw / sv3);
      clean();
    }
    double w = 0;
    double sv = 0;
    double ts = 0;
    double sv2 = 0;
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) == baseline_first) {
        w = RawWrite(dir + "/raw.bin", params);
      } else {
        sv = omni_save();
      }
    }
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) != baseline_first) {
        ts = torch_save();
      } else {
        sv2 = omni_save();
      }
    }
    if (sv < 0 || sv2 < 0) return 1;
    raw_w.push_back(w);
    save.push_back(sv);
    tsave.push_back(ts);
    save_ratio.push_back(w / sv);
    torch_ratio.push_back(ts / sv2);
    // Cold reads: raw read and omni Restore, adjacent, in alternating order.
    for (int pair = 0; pair < read_pairs_per_trial; ++pair) {
      const bool raw_first = (t + pair) % 2 == 0;  // A B, B A; then B A, A B
      double r = 0;
      double rs = 0;
      for (int k = 0; k < 2; ++k) {
        EvictPageCache(dir);
        if ((k == 0) == raw_first) {
          r = RawRead(dir + "/raw.bin", params);
          continue;
        }
        const double t0 = Now();
        auto res = (*mgr)->Restore(reg);
        rs = Now() - t0;
        if (!res.ok()) {
          std::fprintf(stderr, "restore: %s\n", std::string(res.status().message()).c_str());
          return 1;
        }
      }
      raw_r.push_back(r);
      restore.push_back(rs);
      restore_ratio.push_back(r / rs);
    }
    // Async: the stall is the snapshot copy; compare with a plain memcpy of the
    // same bytes, adjacent, in alternating order. The memcpy never overlaps the
    // background write (it would compete for memory bandwidth).
    double m = 0;
    double st = 0;
    for (int k = 0; k < 2; ++k) {
      if ((k == 0) == baseline_first) {
        m = Memcpy(params, copy_dst);
        continue;
      }
      auto a = (*mgr)->SaveAsync(step++, reg, {});
      if (!a.ok()) {
        std::fprintf(stderr, "save async: %s\n", std::string(a.status().message()).c_str());
        return 1;
      }
      st = a->snapshot_s;
      if (!(*mgr)->WaitForPending().ok()) return 1;
    }
    memcpy_s.push_back(m);
    stall.push_back(st);
    stall_ratio.push_back(st / m);
    std::printf(
        "trial %d: raw write %.3f s, save %.3f s; raw read / restore %.3f / %.3f s, %.3f / %.3f "
        "s; async stall %.3f s, memcpy %.3f s; first pair: O_DIRECT write %.3f s, save %.3f s\n",
        t, w, sv, raw_r[raw_r.size() - 2], restore[restore.size() - 2], raw_r.back(),
        restore.back(), st, m, dw, sv3);
    clean();
  }
  const double gib = static_cast<double>(bytes) / (1 << 30);
  const Spread sr = Summarize(save_ratio);
  const Spread rr = Summarize(restore_ratio);
  const Spread ar = Summarize(stall_ratio);
  const Spread tr = Summarize(torch_ratio);
  // save_vs_direct: omni save throughput / O_DIRECT throughput, i.e. the
  // O_DIRECT time over the paired Save's time; null without O_DIRECT.
  std::string direct_json;
  if (have_direct) {
    const Spread dr = Summarize(direct_ratio);
    std::printf(
        "O_DIRECT stream (%zu MiB blocks, queue depth %d) +fsync %.2f GiB/s; save_vs_direct %.3f "
        "[%.3f, %.3f] over %zu pairs\n",
        direct.block >> 20, direct.depth, gib / Median(direct_w), dr.median, dr.min, dr.max,
        direct_ratio.size());
    char buf[256];
    std::snprintf(
        buf, sizeof(buf),
        ",\"save_vs_direct\":%.3f,\"save_vs_direct_min\":%.3f,\"save_vs_direct_max\":%."
        "3f,\"direct_block_mib\":%zu,\"direct_queue_depth\":%d,\"direct_write_gibps\":%.3f",
        dr.median, dr.min, dr.max, direct.block >> 20, direct.depth, gib / Median(direct_w));
    direct_json = buf;
  } else {
    std::printf("save_vs_direct: none (%s)\n", direct_reason.c_str());
    direct_json = ",\"save_vs_direct\":null,\"save_vs_direct_reason\":\"" + direct_reason + "\"";
  }
  std::printf("state %.2f GiB in %zu tensors, %d trials; throughputs are medians of the times\n",
              gib, params.size(), trials);
  std::printf("raw write+fsync %.2f GiB/s, omni save %.2f GiB/s, torch::save+fsync %.2f GiB/s\n",
              gib / Median(raw_w), gib / Median(save), gib / Median(tsave));
  std::printf("raw read (cold) %.2f GiB/s, omni restore (verified load, cold) %.2f GiB/s\n",
              gib / Median(raw_r), gib / Median(restore));
  std::printf("async stall %.3f s, memcpy %.3f s (first snapshot %.3f s)\n", Median(stall),
              Median(memcpy_s), first_stall);
  std::printf(
      "ratios are medians of per-pair ratios (adjacent runs, alternating order): save_vs_raw "
      "%.3f [%.3f, %.3f] over %zu pairs, restore_vs_raw %.3f [%.3f, %.3f] over %zu pairs, "
      "async_stall_vs_memcpy %.3f [%.3f, %.3f] over %zu pairs, save_vs_torch_save %.3f [%.3f, "
      "%.3f]\n",
      sr.median, sr.min, sr.max, save_ratio.size(), rr.median, rr.min, rr.max, restore_ratio.size(),
      ar.median, ar.min, ar.max, stall_ratio.size(), tr.median, tr.min, tr.max);
  std::printf(
      "{\"benchmark\":\"checkpoint\",\"direct_io\":%s,\"state_gib\":%.3f,\"save_vs_raw\":%.3f,"
      "\"restore_vs_raw\":%."
      "3f,\"save_vs_torch_save\":%.3f,\"save_peak_extra_mib\":%.1f,\"async_stall_vs_memcpy\":%."
      "3f,\"async_first_stall_s\":%.3f,\"ratio_method\":\"median_of_pairs\",\"trials\":%d,"
      "\"restore_pairs\":%zu,\"save_vs_raw_min\":%.3f,\"save_vs_raw_max\":%.3f,"
      "\"restore_vs_raw_min\":%.3f,\"restore_vs_raw_max\":%.3f,\"async_stall_vs_memcpy_min\":%.3f,"
      "\"async_stall_vs_memcpy_max\":%.3f,\"async_stall_s\":%.3f,\"memcpy_s\":%.3f%s}\n",
      direct_io ? "true" : "false", gib, sr.median, rr.median, tr.median,
      static_cast<double>(peak_extra_kb) / 1024.0, ar.median, first_stall, trials,
      restore_ratio.size(), sr.min, sr.max, rr.min, rr.max, ar.min, ar.max, Median(stall),
      Median(memcpy_s), direct_json.c_str());
  mgr->reset();  // joins the writer before the files go
  std::filesystem::remove_all(dir, ec);
  return 0;
}
