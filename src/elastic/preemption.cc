#include "omni/preemption.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/thread_name.h"

namespace omni {
namespace {

constexpr int64_t kInfNs = std::numeric_limits<int64_t>::max() / 4;
constexpr int64_t kMaxNs = std::numeric_limits<int64_t>::max();
constexpr int64_t kMinNs = std::numeric_limits<int64_t>::min();

// ------------------------------------------------------------ signal side
// Process-wide state shared with the handler. Only lock-free atomics, so the
// handler is async-signal-safe.
static_assert(std::atomic<int>::is_always_lock_free, "signal handler needs lock-free int");
static_assert(std::atomic<int64_t>::is_always_lock_free, "signal handler needs lock-free int64");
static_assert(std::atomic<bool>::is_always_lock_free, "needs lock-free bool");

std::atomic<bool> g_installed{false};         // one monitor per process
std::atomic<int> g_signal_count{0};           // signals received since Create
std::atomic<int> g_first_signal{0};           // the first signal's number
std::atomic<int64_t> g_first_signal_mono{0};  // its CLOCK_MONOTONIC arrival, ns

int64_t MonotonicNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe (POSIX)
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void OnPreemptSignal(int sig) {
  const int saved_errno = errno;
  int expected = 0;
  if (g_first_signal.compare_exchange_strong(expected, sig)) {
    g_first_signal_mono.store(MonotonicNowNs());
  }
  g_signal_count.fetch_add(1);
  errno = saved_errno;
}

void ResetSignalState() {
  g_first_signal_mono.store(0);
  g_first_signal.store(0);
  g_signal_count.store(0);
}

std::string SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGHUP:
      return "SIGHUP";
    case SIGQUIT:
      return "SIGQUIT";
    default:
      return absl::StrCat("signal ", sig);
  }
}

// ------------------------------------------------------------ arithmetic
int64_t SatAdd(int64_t a, int64_t b) {
  if (b > 0 && a > kMaxNs - b) return kMaxNs;
  if (b < 0 && a < kMinNs - b) return kMinNs;
  return a + b;
}

int64_t SatSub(int64_t a, int64_t b) {
  if (b < 0 && a > kMaxNs + b) return kMaxNs;
  if (b > 0 && a < kMinNs + b) return kMinNs;
  return a - b;
}

// mean + k·stddev in ns; negative → 0; not finite (or absurdly long) → kInfNs.
int64_t CostNs(const Cost& c, double k) {
  const double s = c.mean_s + k * c.stddev_s;
  if (std::isnan(s)) return kInfNs;
  if (s <= 0) return 0;
  const double ns = s * 1e9;
  if (!(ns < static_cast<double>(kInfNs))) return kInfNs;
  return static_cast<int64_t>(std::llround(ns));
}

double Seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

std::string CostText(int64_t ns) {
  return ns >= kInfNs ? std::string("unknown (not finite)") : absl::StrCat(Seconds(ns), " s");
}

// ------------------------------------------------------------ notice file
// Reads the whole file. nullopt when it does not exist.
absl::StatusOr<std::optional<std::string>> ReadNoticeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return std::optional<std::string>();
    return internal::ErrnoStatus(err, absl::StrCat("open preemption notice file ", path));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return internal::ErrnoStatus(errno, absl::StrCat("read preemption notice file ", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("preemption notice file ", path, ": larger than 1 MiB"));
    }
  }
  return std::optional<std::string>(std::move(out));
}

bool IsBlank(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

struct ParsedNotice {
  int64_t deadline_ns = 0;  // on the monitor's clock
  std::string what;         // e.g. "yield_in_s=30"
};

// Converts a notice to the monitor's clock: `mono_now` and `wall_now_ns`
// (CLOCK_REALTIME, Unix ns; nullopt refuses deadline_unix_ms, as for a store
// key) are read together, once, when the notice is read.
// `source` names where the notice came from ("preemption notice file F").
absl::StatusOr<ParsedNotice> ParseNotice(const std::string& source, const std::string& text,
                                         int64_t mono_now, std::optional<int64_t> wall_now_ns) {
  const auto bad = [&source](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", internal::Sv(why),
                     " (expected {\"deadline_unix_ms\": N} or {\"yield_in_s\": S}); ignored"));
  };
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("not a JSON object");
  ParsedNotice out;
  out.deadline_ns = kMaxNs;
  bool any = false;
  if (auto it = j.find("deadline_unix_ms"); it != j.end()) {
    if (!wall_now_ns.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source,
          ": deadline_unix_ms is a wall-clock time, and a store is shared between "
          "hosts whose clocks are never compared: write {\"yield_in_s\": S}; ignored"));
    }
    if (!it->is_number()) return bad("deadline_unix_ms is not a number");
    int64_t delta_ns = 0;
    if (it->is_number_integer()) {
      const int64_t ms = it->get<int64_t>();
      if (ms < 0 || ms > 9'000'000'000'000) return bad("deadline_unix_ms is out of range");
      delta_ns = ms * 1'000'000 - *wall_now_ns;
    } else {
      const double ms = it->get<double>();
      if (!std::isfinite(ms) || ms < 0 || ms > 9e12) return bad("deadline_unix_ms is out of range");
      delta_ns = static_cast<int64_t>(std::llround(ms * 1e6 - static_cast<double>(*wall_now_ns)));
    }
    out.deadline_ns = std::min(out.deadline_ns, SatAdd(mono_now, delta_ns));
    out.what = absl::StrCat("deadline_unix_ms=", it->dump());
    any = true;
  }
  if (auto it = j.find("yield_in_s"); it != j.end()) {
    if (!it->is_number()) return bad("yield_in_s is not a number");
    const double s = it->get<double>();
    if (!std::isfinite(s) || s < 0 || s > 1e9) return bad("yield_in_s is out of range");
    out.deadline_ns =
        std::min(out.deadline_ns, SatAdd(mono_now, static_cast<int64_t>(std::llround(s * 1e9))));
    absl::StrAppend(&out.what, out.what.empty() ? "" : ", ", "yield_in_s=", it->dump());
    any = true;
  }
  if (!any) return bad("neither deadline_unix_ms nor yield_in_s");
  return out;
}

// ------------------------------------------------------------ the monitor
class PreemptionMonitorImpl final : public PreemptionMonitor {
 public:
  PreemptionMonitorImpl(const PreemptionOptions& options, const Clock* clock)
      : options_(options),
        clock_(clock),
        grace_ns_(absl::ToInt64Nanoseconds(options.grace)),
        real_clock_(clock == Clock::Real()) {}

  ~PreemptionMonitorImpl() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (watcher_.joinable()) watcher_.join();
    // Restore in reverse order of installation.
    for (auto it = installed_.rbegin(); it != installed_.rend(); ++it) {
      sigaction(it->first, &it->second, nullptr);
    }
    if (owns_process_slot_) {
      ResetSignalState();
      g_installed.store(false);
    }
  }

  // Takes the process-wide slot and installs the handlers; on failure the
  // destructor undoes whatever was done.
  absl::Status Install() {
    bool expected = false;
    if (!g_installed.compare_exchange_strong(expected, true)) {
      return absl::FailedPreconditionError(
          "a PreemptionMonitor already exists in this process (only one may; destroy it first)");
    }
    owns_process_slot_ = true;
    ResetSignalState();
    std::vector<int> signals = options_.signals;
    std::sort(signals.begin(), signals.end());
    signals.erase(std::unique(signals.begin(), signals.end()), signals.end());
    struct sigaction sa {};
    sa.sa_handler = &OnPreemptSignal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : signals) sigaddset(&sa.sa_mask, sig);  // one handler at a time per thread
    for (int sig : signals) {
      struct sigaction old {};
      if (sigaction(sig, &sa, &old) != 0) {
        const int err = errno;
        return absl::InvalidArgumentError(
            absl::StrCat("PreemptionMonitor: cannot install a handler for ", SignalName(sig), ": ",
                         internal::ErrnoStatus(err, "sigaction").message()));
      }
      installed_.emplace_back(sig, old);
    }
    return absl::OkStatus();
  }

  absl::Status StartWatcher() {
    try {
      watcher_ = std::thread([this] {
        internal::NameThisThread("omni-preempt");
        WatchLoop();
      });
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("PreemptionMonitor: cannot start the watcher thread: ", e.what()));
    }
    return absl::OkStatus();
  }

  BoundaryDecision AtBoundary(const Cost& next_step, const Cost& save) override {
    if (g_signal_count.load() == 0 && !has_notice_.load()) return {};
    absl::MutexLock l(&mu_);
    ObserveSignalsLocked();
    const int signals = g_signal_count.load();
    const int64_t now = clock_->NowNanos();

    int64_t deadline = kMaxNs;
    std::string what;
    if (signal_observed_) {
      deadline = SatAdd(signal_request_ns_, grace_ns_);
      absl::StrAppend(&what, SignalName(g_first_signal.load()), " (grace ", Seconds(grace_ns_),
                      " s)");
    }
    if (has_notice_.load()) {
      deadline = std::min(deadline, notice_deadline_ns_);
      absl::StrAppend(&what, what.empty() ? "" : " and ", notice_source_);
    }
    const int64_t step_ns = CostNs(next_step, options_.k);
    const int64_t save_ns = CostNs(save, options_.k);
    const int64_t remaining = SatSub(deadline, now);
    const bool escalated = signals >= 2;
    const bool save_fits = save_ns <= remaining;
    const double ahead_ns = static_cast<double>(SatAdd(step_ns, save_ns)) * (1 + options_.slack);
    const bool step_and_save_fit = ahead_ns <= static_cast<double>(remaining);

    BoundaryDecision d;
    d.deadline_ns = deadline;
    std::string verdict;
    if (escalated) {
      d.action = save_fits ? BoundaryAction::kSaveAndExit : BoundaryAction::kExitWithoutSave;
      verdict = save_fits ? absl::StrCat("escalated by a second signal (", signals,
                                         " received): saving now")
                          : absl::StrCat("escalated by a second signal (", signals,
                                         " received) and the save does not fit: exiting without "
                                         "saving");
    } else if (step_and_save_fit) {
      d.action = BoundaryAction::kContinue;
      verdict = "one more step and the save fit: continuing";
    } else if (save_fits) {
      d.action = BoundaryAction::kSaveAndExit;
      verdict = "one more step and the save would not fit: saving now";
    } else {
      d.action = BoundaryAction::kExitWithoutSave;
      verdict = "the save does not fit: exiting without saving";
    }
    d.reason =
        absl::StrCat("preemption requested by ", what, "; deadline in ", remaining / 1'000'000,
                     " ms; next step ", CostText(step_ns), ", save ", CostText(save_ns),
                     " (mean + ", options_.k, "·stddev, slack ", options_.slack, "); ", verdict);
    return d;
  }

  void Notice(int64_t deadline_ns) override {
    absl::MutexLock l(&mu_);
    AddNoticeLocked(deadline_ns, "a notice through the API");
  }

  bool pending() const override {
    if (g_signal_count.load() > 0) {
      absl::MutexLock l(&mu_);
      ObserveSignalsLocked();
      return true;
    }
    return has_notice_.load();
  }

  int signals_received() const override { return g_signal_count.load(); }

  absl::Status last_notice_error() const override {
    absl::MutexLock l(&mu_);
    return last_notice_error_;
  }

 private:
  // The first observation of a signal fixes its arrival on the monitor's
  // clock (see the header).
  void ObserveSignalsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (signal_observed_ || g_signal_count.load() == 0) return;
    int64_t t = real_clock_ ? g_first_signal_mono.load() : 0;
    if (t == 0) t = clock_->NowNanos();  // also when a racing handler has not stored it yet
    signal_request_ns_ = t;
    signal_observed_ = true;
  }

  void AddNoticeLocked(int64_t deadline_ns, std::string source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!has_notice_.load() || deadline_ns < notice_deadline_ns_) {
      notice_deadline_ns_ = deadline_ns;
      notice_source_ = std::move(source);
    }
    has_notice_.store(true);
  }

  void PollNoticeFile() {
    const std::string& path = options_.notice_file;
    auto content = ReadNoticeFile(path);
    absl::MutexLock l(&mu_);
    if (!content.ok()) {
      last_notice_error_ = content.status();
      return;
    }
    if (!content->has_value()) return;
    ConsumeNoticeLocked(absl::StrCat("preemption notice file ", path), **content, last_notice_text_,
                        absl::ToUnixNanos(absl::Now()));
  }

  // A notice's content, once per new content (an empty one is none).
  // `wall_now_ns`: nullopt where a wall-clock deadline is refused.
  void ConsumeNoticeLocked(const std::string& source, const std::string& text,
                           std::string& last_text, std::optional<int64_t> wall_now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (text == last_text) return;  // each content is converted once
    last_text = text;
    if (IsBlank(text)) return;
    auto notice = ParseNotice(source, text, clock_->NowNanos(), wall_now_ns);
    if (!notice.ok()) {
      last_notice_error_ = notice.status();
      return;
    }
    AddNoticeLocked(notice->deadline_ns, absl::StrCat(source, " (", notice->what, ")"));
  }

  // The store key holds the same JSON as the notice file, but only
  // yield_in_s: a store is shared between hosts, and wall clocks of
  // different hosts are never compared.
  void PollNoticeStore() {
    const std::string source =
        absl::StrCat("preemption notice store key '", options_.notice_key, "'");
    absl::StatusOr<std::optional<std::string>> content =
        options_.notice_store->TryGet(options_.notice_key);
    absl::MutexLock l(&mu_);
    if (!content.ok()) {
      last_notice_error_ = absl::Status(content.status().code(),
                                        absl::StrCat(source, ": ", content.status().message()));
      return;
    }
    if (!content->has_value()) return;
    ConsumeNoticeLocked(source, **content, last_notice_key_text_, std::nullopt);
  }

  void WatchLoop() {
    while (true) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        ObserveSignalsLocked();
      }
      if (!options_.notice_file.empty()) PollNoticeFile();
      if (options_.notice_store != nullptr) PollNoticeStore();
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.notice_poll);
      if (stop_) return;
    }
  }

  const PreemptionOptions options_;
  const Clock* const clock_;
  const int64_t grace_ns_;
  const bool real_clock_;
  std::vector<std::pair<int, struct sigaction>> installed_;  // signal, previous action
  bool owns_process_slot_ = false;
  std::thread watcher_;

  std::atomic<bool> has_notice_{false};  // set under mu_, read without it
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  mutable bool signal_observed_ ABSL_GUARDED_BY(mu_) = false;
  mutable int64_t signal_request_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t notice_deadline_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::string notice_source_ ABSL_GUARDED_BY(mu_);
  std::string last_notice_text_ ABSL_GUARDED_BY(mu_);
  std::string last_notice_key_text_ ABSL_GUARDED_BY(mu_);
  absl::Status last_notice_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status ApplyEnvironment(PreemptionOptions& options) {
  constexpr const char* kVar = "OMNI_PREEMPT_GRACE_S";
  const char* value = std::getenv(kVar);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  double s = 0;
  if (!absl::SimpleAtod(value, &s) || !std::isfinite(s) || s < 0 || s > 1e9) {
    return absl::InvalidArgumentError(absl::StrCat(
        kVar, "=\"", value, "\" is not a number of seconds >= 0 (the preemption grace period)"));
  }
  options.grace = absl::Seconds(s);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PreemptionMonitor>> PreemptionMonitor::Create(
    const PreemptionOptions& options, const Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("PreemptionMonitor: clock is null");
  if (options.notice_poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PreemptionOptions.notice_poll must be positive");
  }
  if (options.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("PreemptionOptions.grace must not be negative");
  }
  if (!std::isfinite(options.k) || options.k < 0) {
    return absl::InvalidArgumentError("PreemptionOptions.k must be finite and >= 0");
  }
  if (!std::isfinite(options.slack) || options.slack < 0) {
    return absl::InvalidArgumentError("PreemptionOptions.slack must be finite and >= 0");
  }
  if ((options.notice_store == nullptr) != options.notice_key.empty()) {
    return absl::InvalidArgumentError(
        "PreemptionOptions.notice_store and notice_key go together (both or neither)");
  }
  if (options.notice_store != nullptr) {
    if (auto st = ValidateStoreKey(options.notice_key); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("PreemptionOptions.notice_key: ", st.message()));
    }
  }
  auto monitor = std::make_unique<PreemptionMonitorImpl>(options, clock);
  if (auto st = monitor->Install(); !st.ok()) return st;
  if (auto st = monitor->StartWatcher(); !st.ok()) return st;
  return std::unique_ptr<PreemptionMonitor>(std::move(monitor));
}

}  // namespace omni
