// bench_job_checkpoint: the job-level save of N = 1, 2, 4 replicas (threads,
// each with its own JobCheckpointManager) into one shared directory on one
// disk, and the bytes each replica wrote; beside it, the same replicas each
// saving everything into a directory of its own (what every replica did
// before job-level checkpoints).
//
//   bench_job_checkpoint [--mib M] [--trials T] [--dir DIR]
//
// The replicated state is M MiB (default 128) in 16 tensors plus a few
// small ones; every replica also has 64 KiB of its own. A job-level save's
// time is from the moment all replicas start until the last returns
// (durable: every part and the manifest fsynced). Median over T trials
// (default 5), the two kinds alternating which goes first. Last line: one
// JSON object.
#include "omni/job_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "omni/checkpoint.h"
#include "omni/state.h"

namespace {

struct Shared {
  std::vector<std::vector<float>> tensors;
  std::vector<float> small = std::vector<float>(1000, 1.0F);
};

// One replica's registries over the shared replicated memory.
struct Replica {
  Replica(Shared& s, int id) : own(64 << 10, static_cast<char>(id)) {
    for (size_t i = 0; i < s.tensors.size(); ++i) {
      states.push_back(std::make_unique<omni::BytesState>("t", s.tensors[i].data(),
                                                          s.tensors[i].size() * sizeof(float)));
      Check(replicated.Register(absl::StrCat("layer", i), states.back().get()));
    }
    states.push_back(
        std::make_unique<omni::BytesState>("v", s.small.data(), s.small.size() * sizeof(float)));
    Check(replicated.Register("optim", states.back().get()));
    states.push_back(std::make_unique<omni::BytesState>("state", own.data(), own.size()));
    Check(per_replica.Register("rng", states.back().get()));
  }
  static void Check(const absl::Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  std::vector<char> own;
  std::vector<std::unique_ptr<omni::BytesState>> states;
  omni::StateRegistry replicated, per_replica;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Trial {
  double seconds = 0;
  std::vector<int64_t> bytes;       // per replica: its file
  std::vector<int64_t> replicated;  // per replica: its share of the replicated data
};

// Runs `n` replicas at once; `shared_dir` empty: each into a directory of
// its own (SaveAlone there).
Trial Run(std::vector<std::unique_ptr<Replica>>& reps, int n, const std::string& root, bool shared,
          int64_t step) {
  std::vector<std::unique_ptr<omni::JobCheckpointManager>> mgrs;
  for (int r = 0; r < n; ++r) {
    omni::JobCheckpointOptions o;
    o.dir = shared ? root + "/shared" : absl::StrCat(root, "/own-", r);
    o.job_id = "bench";
    o.replica_id = absl::StrCat("r", r);
    o.keep_last = 100;  // the directories are removed between trials, untimed
    absl::StatusOr<std::unique_ptr<omni::JobCheckpointManager>> m =
        omni::JobCheckpointManager::Open(o);
    Replica::Check(m.status());
    mgrs.push_back(*std::move(m));
  }
  Trial t;
  t.bytes.assign(n, 0);
  t.replicated.assign(n, 0);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return go; });
      }
      absl::StatusOr<omni::JobSaveStats> st;
      if (shared) {
        omni::JobSaveGroup g;
        g.rank = r;
        g.size = n;
        g.token = static_cast<uint64_t>(step) * 1000 + static_cast<uint64_t>(n);
        st = mgrs[r]->Save(step, g, reps[r]->replicated, reps[r]->per_replica, {});
      } else {
        st = mgrs[r]->SaveAlone(step, reps[r]->replicated, reps[r]->per_replica, {});
      }
      Replica::Check(st.status());
      t.bytes[r] = st->bytes;
      t.replicated[r] = st->replicated_bytes;
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> l(mu);
    go = true;
  }
  cv.notify_all();
  for (std::thread& th : threads) th.join();
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  mgrs.clear();
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    std::error_code ec;
    std::filesystem::remove_all(e.path(), ec);
  }
  return t;
}

std::string JsonList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppend(&out, i ? "," : "", v[i]);
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 128;
  int trials = 5;
  std::string base = std::filesystem::temp_directory_path().string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") {
      mib = std::atoll(argv[i + 1]);
    } else if (a == "--trials") {
      trials = std::atoi(argv[i + 1]);
    } else if (a == "--dir") {
      base = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: bench_job_checkpoint [--mib M] [--trials T] [--dir DIR]\n");
      return 2;
    }
  }
  if (mib < 1 || trials < 1) {
    std::fprintf(stderr, "bench_job_checkpoint: --mib and --trials must be positive\n");
    return 2;
  }
  std::string tmpl = base + "/omni_bench_job_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string root = tmpl;
  Shared shared;
  const size_t per_tensor = static_cast<size_t>(mib) * (1 << 20) / 16 / sizeof(float);
  for (int i = 0; i < 16; ++i) shared.tensors.emplace_back(per_tensor, static_cast<float>(i));
  std::vector<std::unique_ptr<Replica>> reps;
  reps.reserve(4);
  for (int r = 0; r < 4; ++r) reps.push_back(std::make_unique<Replica>(shared, r));

  std::string json = absl::StrCat("{\"benchmark\":\"job_checkpoint\",\"replicated_mib\":", mib,
                                  ",\"trials\":", trials, ",\"dir\":\"", base, "\"");
  int64_t step = 1;
  for (int n : {1, 2, 4}) {
    std::vector<double> job_s, own_s;
    Trial last;
    for (int k = 0; k < trials; ++k) {  // alternating which goes first
      if (k % 2 == 1) own_s.push_back(Run(reps, n, root, /*shared=*/false, step++).seconds);
      Trial t = Run(reps, n, root, /*shared=*/true, step++);
      job_s.push_back(t.seconds);
      last = t;
      if (k % 2 == 0) own_s.push_back(Run(reps, n, root, /*shared=*/false, step++).seconds);
    }
    const double job = Median(job_s);
    const double own = Median(own_s);
    std::printf(
        "N=%d: job-level save %.3f s (median of %d), bytes per replica %s, replicated "
        "share %s; each replica saving everything into its own directory %.3f s\n",
        n, job, trials, JsonList(last.bytes).c_str(), JsonList(last.replicated).c_str(), own);
    absl::StrAppend(&json, ",\"n", n, "\":{\"job_save_s\":", absl::StrFormat("%.4f", job),
                    ",\"bytes_per_replica\":", JsonList(last.bytes),
                    ",\"replicated_bytes_per_replica\":", JsonList(last.replicated),
                    ",\"separate_dirs_save_s\":", absl::StrFormat("%.4f", own), "}");
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  std::printf("%s}\n", json.c_str());
  return 0;
}
