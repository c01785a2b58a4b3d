// omni: the command-line tool for people who operate Omni jobs.
//
//   omni info                      build configuration, NCCL / device probe
//   omni stats LOG [--json]        step and phase statistics of a step log
//   omni forecast LOG [--at-step N] [--k K] [--horizon-s S] [--previous LOG2] [--json]
//                                  the forecast the runtime would have published
//   omni eval LOG [--stride N] [--k K] [--horizon-s S] [--notices-table-only]
//            [--previous LOG2] [--json]
//                                  precision / recall of forecasts replayed on LOG
//   omni plot LOG [--out FILE.svg] [--from-step N] [--to-step N]
//                                  SVG timeline: real idle time against forecast windows
//   omni ckpt ls DIR               checkpoints under DIR: step, shards, bytes, created, valid;
//                                  for a job-level checkpoint (elastic job, shared DIR) each
//                                  part: the replica that wrote it and what it holds
//   omni ckpt verify DIR|STEPDIR   every checksum of one checkpoint (or of all under DIR;
//                                  a DIR without any fails)
//   omni ckpt show STEPDIR         a checkpoint's manifest and entries
//   omni store serve --listen HOST:PORT
//                                  the job's TCPStore as its own process: runs the
//                                  omni-store binary beside this one (it links
//                                  LibTorch, which this tool does not)
//
// Exit codes: 0 success, 1 the operation failed (message on stderr), 2 usage
// (including a numeric option that does not parse or is out of range).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli_numbers.h"
#include "omni/checkpoint.h"
#include "omni/evaluator.h"
#include "omni/job_checkpoint.h"
#include "omni/nccl.h"
#include "omni/step_log.h"
#include "omni/version.h"
#include "plot.h"

namespace {

constexpr const char* kUsage =
    "usage: omni info\n"
    "       omni stats LOG [--window N] [--json]\n"
    "       omni forecast LOG [--at-step N] [--k K] [--horizon-s S] [--window N] [--previous "
    "LOG2]\n"
    "                [--json]\n"
    "       omni eval LOG [--stride N] [--k K] [--horizon-s S] [--window N] [--horizon]\n"
    "                [--notices-table-only] [--previous LOG2] [--json]\n"
    "         (--horizon scores each forecast over its whole horizon instead of\n"
    "          while it is the current one; --window N: the forecaster learns from\n"
    "          the last N steps of the current regime, default 512, at least 8;\n"
    "          --notices-table-only: the live notices without the forecast's\n"
    "          windows they are matched to; --previous LOG2 (forecast, eval, plot):\n"
    "          LOG is a resumed run's and LOG2 the run's before it, whose last 1024\n"
    "          steps before LOG's first are learned first, unscored, as the live\n"
    "          telemetry does)\n"
    "       omni plot LOG [--out FILE.svg] [--from-step N] [--to-step N] [--k K] [--width PX]\n"
    "                [--previous LOG2]\n"
    "       omni ckpt ls DIR\n"
    "       omni ckpt verify DIR|STEPDIR   (exit 1 naming the first bad file / key)\n"
    "       omni ckpt show STEPDIR\n"
    "       omni store serve --listen HOST:PORT   (runs omni-store, built with LibTorch)\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "omni: %s\n%s", msg.c_str(), kUsage);
  return 2;
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "omni: %s\n", std::string(st.message()).c_str());
  return 1;
}

struct Parsed {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  bool json = false;
  bool horizon = false;
  bool notices_table_only = false;
};

// Flags take one value except --json. Unknown flags are reported by name.
bool Parse(int argc, char** argv, const std::vector<std::string>& allowed, Parsed& out,
           std::string& err) {
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      out.json = true;
    } else if (a == "--horizon") {
      out.horizon = true;
    } else if (a == "--notices-table-only") {
      out.notices_table_only = true;
    } else if (a.rfind("--", 0) == 0) {
      bool ok = false;
      for (const auto& f : allowed) ok = ok || f == a;
      if (!ok) {
        err = "unknown flag " + a;
        return false;
      }
      if (i + 1 >= argc) {
        err = "missing value for " + a;
        return false;
      }
      out.flags[a] = argv[++i];
    } else {
      out.positional.push_back(a);
    }
  }
  return true;
}

// Numeric options (cli_numbers.h); `v` keeps its default when the flag is
// absent.
bool Integer(const Parsed& p, const std::string& flag, int64_t lo, int64_t hi, int64_t& v,
             std::string& err) {
  auto it = p.flags.find(flag);
  return it == p.flags.end() || omni::ParseInteger(flag, it->second, lo, hi, v, err);
}

bool Real(const Parsed& p, const std::string& flag, double lo, double hi, double& v,
          std::string& err) {
  auto it = p.flags.find(flag);
  return it == p.flags.end() || omni::ParseReal(flag, it->second, lo, hi, v, err);
}

int Info() {
  std::printf("%s\n", omni::BuildInfo().c_str());
  auto nccl = omni::ProbeNccl();
  if (nccl.ok()) {
    std::printf("nccl: runtime %d, %d CUDA device(s), shrink %s\n", nccl->runtime_version,
                nccl->cuda_devices, nccl->supports_shrink ? "yes" : "no");
  } else {
    std::printf("nccl: unavailable: %s\n", std::string(nccl.status().message()).c_str());
  }
  return 0;
}

// ---------------------------------------------------------------- omni ckpt

std::string UtcTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const auto secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  char buf[32];
  if (gmtime_r(&secs, &tm) == nullptr ||
      std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) == 0) {
    return "-";
  }
  return buf;
}

// A step directory: has a manifest, or is named like one.
bool IsStepDir(const std::string& path) {
  struct stat st;
  if (::stat((path + "/manifest.json").c_str(), &st) == 0) return true;
  std::string base = path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.rfind('/') == std::string::npos ? 0 : base.rfind('/') + 1);
  return base.rfind("step-", 0) == 0;
}

int CkptLs(const std::string& dir) {
  auto all = omni::ScanCheckpoints(dir);
  if (!all.ok()) return Fail(all.status());
  // Job-level checkpoints (layout "job") are read by their own reader.
  auto job = omni::ScanJobCheckpoints(dir);
  if (!job.ok()) return Fail(job.status());
  for (omni::CheckpointStatus& c : *all) {
    for (omni::CheckpointStatus& j : *job) {
      if (j.info.path == c.info.path) c = j;
    }
  }
  if (all->empty()) {
    std::printf("no checkpoints in %s\n", dir.c_str());
    return 0;
  }
  std::printf("%-12s  %-6s  %6s  %14s  %-20s  %s\n", "STEP", "LAYOUT", "SHARDS", "BYTES",
              "CREATED (UTC)", "VALID");
  for (const omni::CheckpointStatus& c : *all) {
    const bool ok = c.status.ok();
    const bool is_job = omni::IsJobCheckpoint(c.info.path);
    const std::string valid = ok ? "yes" : "no: " + std::string(c.status.message());
    std::printf("%-12" PRId64 "  %-6s  %6d  %14" PRId64 "  %-20s  %s\n", c.info.step,
                is_job ? "job" : "rank", ok || c.info.format_version > 0 ? c.info.world_size : 0,
                c.info.bytes, UtcTime(c.info.created_unix_ms).c_str(), valid.c_str());
    if (!is_job) continue;
    auto parts = omni::JobCheckpointParts(c.info.path);
    if (!parts.ok()) continue;
    for (const omni::JobPartInfo& p : *parts) {
      std::printf("  part %-5d replica %-12s %14" PRId64 " bytes: replicated %" PRId64
                  ", per-replica %" PRId64 "\n",
                  p.rank, p.replica_id.empty() ? "-" : p.replica_id.c_str(), p.bytes,
                  p.replicated_bytes, p.replica_bytes);
    }
  }
  return 0;
}

int CkptVerify(const std::string& path) {
  std::vector<std::string> dirs;
  if (IsStepDir(path)) {
    dirs.push_back(path);
  } else {
    auto all = omni::ScanCheckpoints(path);
    if (!all.ok()) return Fail(all.status());
    for (const omni::CheckpointStatus& c : *all) dirs.push_back(c.info.path);
    if (dirs.empty()) {
      std::fprintf(stderr, "omni: no checkpoints in %s: nothing verified\n", path.c_str());
      return 1;
    }
  }
  int bad = 0;
  for (const std::string& d : dirs) {
    const absl::Status st =
        omni::IsJobCheckpoint(d) ? omni::VerifyJobCheckpoint(d) : omni::VerifyCheckpoint(d);
    if (st.ok()) {
      std::printf("OK   %s\n", d.c_str());
    } else {
      ++bad;
      std::string msg(st.message());  // names the file (and key), usually under d
      if (msg.rfind(d, 0) != 0) msg.insert(0, d + ": ");
      std::printf("BAD  %s\n", msg.c_str());
    }
  }
  return bad == 0 ? 0 : 1;
}

int Ckpt(int argc, char** argv) {
  if (argc < 3) return Usage("ckpt needs a subcommand: ls, verify or show");
  const std::string sub = argv[2];
  if (argc != 4) return Usage("ckpt " + sub + " takes exactly one directory");
  const std::string path = argv[3];
  if (sub == "ls") return CkptLs(path);
  if (sub == "verify") return CkptVerify(path);
  if (sub == "show") {
    auto text = omni::IsJobCheckpoint(path) ? omni::DescribeJobCheckpoint(path)
                                            : omni::DescribeCheckpoint(path);
    if (!text.ok()) return Fail(text.status());
    std::printf("%s", text->c_str());
    return 0;
  }
  return Usage("unknown ckpt subcommand " + sub);
}

// `omni store ...`: replaces this process with the omni-store binary of the
// same directory (built with LibTorch), passing the arguments after "store".
int StoreCommand(int argc, char** argv) {
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0) return Usage("store: cannot find this program's directory");
  self.resize(static_cast<size_t>(n));
  const std::string tool = self.substr(0, self.rfind('/') + 1) + "omni-store";
  std::vector<char*> args{const_cast<char*>(tool.c_str())};  // execv's signature
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(tool.c_str(), args.data());
  std::fprintf(stderr, "omni: store: cannot run %s (built only with LibTorch): %s\n", tool.c_str(),
               std::strerror(errno));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("missing command");
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "help") {
    std::printf("%s", kUsage);
    return 0;
  }
  if (cmd == "info") return Info();
  if (cmd == "ckpt") return Ckpt(argc, argv);
  if (cmd == "plot") return omni::cli::PlotCommand(argc, argv);
  if (cmd == "store") return StoreCommand(argc, argv);
  if (cmd != "stats" && cmd != "forecast" && cmd != "eval") return Usage("unknown command " + cmd);

  Parsed p;
  std::string err;
  if (!Parse(argc, argv, {"--window", "--at-step", "--k", "--horizon-s", "--stride", "--previous"},
             p, err)) {
    return Usage(err);
  }
  if (p.positional.size() != 1) return Usage(cmd + " takes exactly one step log");
  if (p.flags.count("--previous") != 0 && cmd == "stats") {
    return Usage("--previous is for forecast and eval");
  }
  int64_t window = 200, at_step = -1, stride = 1;
  double k = 2.0, horizon_s = 300;
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  // horizon_s * 1e9 must fit an int64 of nanoseconds: at most ~292 years.
  if (!Integer(p, "--window", 1, kMaxInt, window, err) ||
      !Integer(p, "--at-step", 0, std::numeric_limits<int64_t>::max(), at_step, err) ||
      !Real(p, "--k", 0, 1e6, k, err) || !Real(p, "--horizon-s", 0, 9e9, horizon_s, err) ||
      !Integer(p, "--stride", 1, kMaxInt, stride, err)) {
    return Usage(err);
  }

  // For forecast and eval, --window is the steps the forecaster learns from.
  if (cmd != "stats" && window < 8) {
    return Usage("--window must be at least 8 for " + cmd + ", got " + std::to_string(window));
  }

  auto log = omni::ReadStepLog(p.positional[0]);
  if (!log.ok()) return Fail(log.status());
  omni::cli::NoteUnfinishedTail(p.positional[0], *log);
  // --previous: the run before this resumed one, whose end the live
  // forecaster learned first (TelemetryOptions::learn_previous_steps).
  absl::StatusOr<omni::StepLog> previous;
  if (auto it = p.flags.find("--previous"); it != p.flags.end()) {
    previous = omni::ReadStepLogTail(it->second, omni::EvaluateOptions().previous_steps);
    if (!previous.ok()) return Fail(previous.status());
  }

  omni::StepStatsOptions so;
  so.window = static_cast<int>(window);
  omni::ForecastOptions fo;
  fo.k = k;
  fo.horizon_ns = static_cast<int64_t>(horizon_s * 1e9);
  fo.checkpoint = log->header.checkpoint;
  fo.eval = log->header.eval;
  fo.pipeline = log->header.pipeline;
  // --window: for stats the rolling window; for forecast and eval the steps
  // of the current regime the forecaster learns from.
  if (p.flags.count("--window") != 0 && cmd != "stats") fo.history_steps = static_cast<int>(window);

  if (cmd == "eval") {
    omni::EvaluateOptions eo;
    eo.forecast = fo;
    eo.stride_steps = static_cast<int>(stride);
    eo.scoring = p.horizon ? omni::Scoring::kHorizon : omni::Scoring::kLive;
    eo.notices.match_forecast = !p.notices_table_only;
    if (previous.ok()) eo.previous = &*previous;
    auto rep = omni::Evaluate(*log, eo);
    if (!rep.ok()) return Fail(rep.status());
    std::printf("%s\n", p.json ? rep->ToJson().c_str() : rep->ToTable().c_str());
    return 0;
  }

  if (cmd == "stats") {
    auto stats = omni::StepStats::Create(so, log->header.phases);
    if (!stats.ok()) return Fail(stats.status());
    for (const omni::StepRecord& rec : log->steps) {
      if (at_step >= 0 && static_cast<double>(rec.step) > at_step) break;
      if (auto st = stats->Add(rec); !st.ok()) return Fail(st);
    }
    const omni::StatsSnapshot s = omni::SnapshotOf(*stats, so.window);
    std::printf("%s\n", p.json ? s.ToJson().c_str() : s.ToTable().c_str());
    return 0;
  }
  // forecast: replay the log up to --at-step (inclusive; the whole log by
  // default) and print what the runtime would have published then.
  auto fc = omni::Forecaster::Create(fo);
  if (!fc.ok()) return Fail(fc.status());
  if (at_step >= 0 && at_step < static_cast<double>(log->steps.front().step)) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--at-step ", static_cast<int64_t>(at_step), " is before the first step (",
                     log->steps.front().step, ") of ", p.positional[0])));
  }
  if (previous.ok()) {
    auto learned = omni::PreviousRunSteps(*previous, log->steps.front(), log->header.phases,
                                          omni::EvaluateOptions().previous_steps);
    if (!learned.ok()) return Fail(learned.status());
    for (const omni::StepRecord& rec : *learned) {
      if (auto st = fc->Observe(rec, log->header.phases); !st.ok()) return Fail(st);
    }
  }
  for (const omni::StepRecord& rec : log->steps) {
    if (at_step >= 0 && static_cast<double>(rec.step) > at_step) break;
    if (auto st = fc->Observe(rec, log->header.phases); !st.ok()) return Fail(st);
  }
  const omni::StepRecord* last = nullptr;
  for (const omni::StepRecord& rec : log->steps) {
    if (rec.step == fc->last_step()) last = &rec;
  }
  auto f = fc->Predict(last != nullptr ? last->end_ns : 0);
  if (!f.ok()) return Fail(f.status());
  std::printf("%s\n",
              p.json ? omni::ForecastToJson(*f).c_str() : omni::ForecastToTable(*f).c_str());
  return 0;
}
