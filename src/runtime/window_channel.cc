#include "omni/window_channel.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fs.h"
#include "runtime/quantile.h"
#include "runtime/window_doorbell.h"
#include "runtime/window_layout.h"

namespace omni {
namespace {

using internal::WindowLayout;

constexpr int kMaxRetries = 10'000;
constexpr size_t kMaxNameLength = 100;

absl::Status ValidateChannelName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window channel name must be 1..", kMaxNameLength, " characters, got '", name, "'"));
  }
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "window channel name '", name, "' has a character other than [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

std::string ShmName(const std::string& name) { return "/omni-window." + name; }

// Copies the notice record; false when a write overlapped (retry).
bool TryReadNotice(const internal::NoticeRecord& r, WindowNotice& n) {
  const uint64_t s1 = r.seq.load(std::memory_order_acquire);
  if ((s1 & 1) != 0) return false;
  n.sequence = r.sequence.load(std::memory_order_relaxed);
  n.step = r.step.load(std::memory_order_relaxed);
  n.opened_ns = r.opened_ns.load(std::memory_order_relaxed);
  n.closed_ns = r.closed_ns.load(std::memory_order_relaxed);
  const uint32_t state = r.state.load(std::memory_order_relaxed);
  const uint32_t phase = r.phase.load(std::memory_order_relaxed);
  const uint32_t kind = r.kind.load(std::memory_order_relaxed);
  const uint32_t ordinal = r.ordinal.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (r.seq.load(std::memory_order_relaxed) != s1) return false;
  n.state = state <= 2 ? static_cast<WindowState>(state) : WindowState::kNone;
  n.phase = static_cast<PhaseId>(phase < kNoticePhases ? phase : 0);
  n.before_step = n.phase == kBetweenStepsPhase;
  n.kind = kind < kNumIdleKinds ? static_cast<IdleKind>(kind) : IdleKind::kNone;
  n.ordinal = static_cast<int>(std::min<uint32_t>(ordinal, 1u << 30));
  return true;
}

struct PhaseCopy {
  char name[internal::kPhaseNameWords * 8 + 1] = {};
  DurationQuantiles q;
  double confidence = 0;
};

// The quantiles of `phase`'s window number `ordinal` (WindowTableOf).
bool TryReadPhase(const internal::PhasesRecord& r, PhaseId phase, int ordinal, PhaseCopy& out) {
  const uint64_t s1 = r.seq.load(std::memory_order_acquire);
  if ((s1 & 1) != 0) return false;
  const internal::PhaseRecord& p = r.phases[phase];
  for (size_t i = 0; i < internal::kPhaseNameWords; ++i) {
    const uint64_t w = p.name[i].load(std::memory_order_relaxed);
    std::memcpy(out.name + 8 * i, &w, 8);
  }
  out.q = DurationQuantiles{};
  const int t = WindowTableOf(ordinal);
  out.q.samples = p.samples[t].load(std::memory_order_relaxed);
  for (int i = 0; i < kDurationQuantiles; ++i) {
    out.q.ns[i] = p.quantile_ns[t][i].load(std::memory_order_relaxed);
  }
  out.q.claim_confidence = p.claim_confidence[t].load(std::memory_order_relaxed);
  out.confidence = r.confidence.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return r.seq.load(std::memory_order_relaxed) == s1;
}

// Copies the outlook record; false when a write overlapped (retry).
bool TryReadOutlook(const internal::OutlookRecord& r, WindowOutlook& o) {
  const uint64_t s1 = r.seq.load(std::memory_order_acquire);
  if ((s1 & 1) != 0) return false;
  o.sequence = r.sequence.load(std::memory_order_relaxed);
  const uint32_t state = r.state.load(std::memory_order_relaxed);
  o.made_at_ns = r.made_at_ns.load(std::memory_order_relaxed);
  o.horizon_ns = r.horizon_ns.load(std::memory_order_relaxed);
  o.covered_until_ns = r.covered_until_ns.load(std::memory_order_relaxed);
  o.confidence = r.confidence.load(std::memory_order_relaxed);
  o.last_step = r.last_step.load(std::memory_order_relaxed);
  o.busy_until_ns = r.busy_until_ns.load(std::memory_order_relaxed);
  o.busy_announced_ns = r.busy_announced_ns.load(std::memory_order_relaxed);
  for (size_t k = 0; k < o.next.size(); ++k) {
    const internal::NextWindowRecord& in = r.kinds[k];
    NextIdleWindow& n = o.next[k];
    const uint32_t outlook = in.state.load(std::memory_order_relaxed);
    n.outlook = outlook <= 2 ? static_cast<KindOutlook>(outlook) : KindOutlook::kUnknown;
    n.windows = in.windows.load(std::memory_order_relaxed);
    n.earliest_start_ns = in.earliest_start_ns.load(std::memory_order_relaxed);
    n.latest_start_ns = in.latest_start_ns.load(std::memory_order_relaxed);
    n.guaranteed_ns = in.guaranteed_ns.load(std::memory_order_relaxed);
    n.expected_ns = in.expected_ns.load(std::memory_order_relaxed);
    n.step = in.step.load(std::memory_order_relaxed);
    n.last_seen_step = in.last_seen_step.load(std::memory_order_relaxed);
  }
  o.num_claims = static_cast<int>(
      std::min<uint32_t>(r.num_claims.load(std::memory_order_relaxed), kMaxForecastClaims));
  for (int i = 0; i < o.num_claims; ++i) {
    const internal::ClaimRecord& in = r.claims[i];
    ForecastClaim& c = o.claims[static_cast<size_t>(i)];
    c.step = in.step.load(std::memory_order_relaxed);
    c.guaranteed_ns = in.guaranteed_ns.load(std::memory_order_relaxed);
    const uint32_t phase = in.phase.load(std::memory_order_relaxed);
    const uint16_t kind = in.kind.load(std::memory_order_relaxed);
    c.phase = static_cast<PhaseId>(phase < kNoticePhases ? phase : 0);
    c.kind = kind < kNumIdleKinds ? static_cast<IdleKind>(kind) : IdleKind::kNone;
    c.ordinal = in.ordinal.load(std::memory_order_relaxed);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (r.seq.load(std::memory_order_relaxed) != s1) return false;
  o.state = state <= 2 ? static_cast<OutlookState>(state) : OutlookState::kNone;
  return true;
}

// The guaranteed length the outlook's forecast states for the window of
// (step, phase, kind, ordinal) into `g` (0: none); false when a write
// overlapped (retry). The claims alone: a reader of an open window does
// this at every poll.
bool TryReadGuarantee(const internal::OutlookRecord& r, const WindowNotice& n, int64_t& g) {
  const uint64_t s1 = r.seq.load(std::memory_order_acquire);
  if ((s1 & 1) != 0) return false;
  g = 0;
  if (r.state.load(std::memory_order_relaxed) == static_cast<uint32_t>(OutlookState::kForecast)) {
    const uint32_t num =
        std::min<uint32_t>(r.num_claims.load(std::memory_order_relaxed), kMaxForecastClaims);
    for (uint32_t i = 0; i < num; ++i) {
      const internal::ClaimRecord& c = r.claims[i];
      if (c.step.load(std::memory_order_relaxed) != n.step ||
          c.phase.load(std::memory_order_relaxed) != n.phase ||
          c.kind.load(std::memory_order_relaxed) != static_cast<uint16_t>(n.kind) ||
          c.ordinal.load(std::memory_order_relaxed) != n.ordinal) {
        continue;
      }
      g = c.guaranteed_ns.load(std::memory_order_relaxed);
      break;
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return r.seq.load(std::memory_order_relaxed) == s1;
}

// The notice record's seqlock word doubles as a doorbell: the writer wakes
// the readers waiting on it (a futex on its low 32 bits, shared between
// processes) after each notice, so a reader learns of an open or a close
// without polling. Little-endian: the low half is at the word's address.
uint32_t* Doorbell(const std::atomic<uint64_t>& seq) {
  static_assert(sizeof(std::atomic<uint64_t>) == 8);
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint64_t>*>(&seq));  // NOLINT
}

// Rings for the readers waiting on any of the idle kinds in `kinds` (a bit
// per IdleKind, internal::DoorbellKindBit; ~0: every reader): a reader that
// waits only for data stalls is not woken by an eval's notices.
void RingDoorbell(const std::atomic<uint64_t>& seq, uint32_t kinds) {
  ::syscall(SYS_futex, Doorbell(seq), FUTEX_WAKE_BITSET, INT_MAX, nullptr, nullptr, kinds);
}

// Between two reads that found the writer in the middle of an update: every
// 64 tries a sleep, not a yield. A writer preempted mid-update on the
// reader's core (by a reader in a real-time class: a pausing supervisor) can
// run only once the reader sleeps; sched_yield gives the core to threads of
// the reader's own class and priority alone, so a yielding real-time reader
// spun until the writer's core was throttled for it (seen: the supervisor of
// colocate_guest --pause spinning while the host's telemetry worker, which
// rewrites the phase table after every step, waited).
void BackOff(int tries) {
  if (tries % 64 == 0) absl::SleepFor(absl::Microseconds(20));
}

// A consistent notice with the remaining duration computed at `now_ns`.
absl::StatusOr<WindowNotice> ReadLayout(const WindowLayout& l, int64_t now_ns,
                                        const std::string& what) {
  WindowNotice n;
  int tries = 0;
  while (!TryReadNotice(l.notice, n)) {
    if (++tries >= kMaxRetries) {
      return absl::UnavailableError(
          absl::StrCat(what, ": the writer stayed in the middle of a notice update (did it die?)"));
    }
    BackOff(tries);
  }
  PhaseCopy p;
  tries = 0;
  while (!TryReadPhase(l.phases, n.phase, n.ordinal, p)) {
    if (++tries >= kMaxRetries) {
      return absl::UnavailableError(absl::StrCat(
          what, ": the writer stayed in the middle of a phase-table update (did it die?)"));
    }
    BackOff(tries);
  }
  n.writer_closed = l.writer_closed.load(std::memory_order_acquire) != 0;
  n.read_at_ns = now_ns;
  n.confidence = p.confidence;
  n.phase_samples = p.q.samples;
  if (n.state != WindowState::kNone) n.phase_name = p.name;
  if (n.state == WindowState::kOpen) {
    n.elapsed_ns = std::max<int64_t>(0, now_ns - n.opened_ns);
    n.remaining_ns = RemainingGivenElapsed(p.q, n.elapsed_ns, p.confidence);
    n.remaining_median_ns = RemainingGivenElapsed(p.q, n.elapsed_ns, 0.5);
    tries = 0;
    while (!TryReadGuarantee(l.outlook, n, n.forecast_guaranteed_ns)) {
      if (++tries >= kMaxRetries) {
        return absl::UnavailableError(absl::StrCat(
            what, ": the writer stayed in the middle of an outlook update (did it die?)"));
      }
      BackOff(tries);
    }
    n.remaining_ns = WithForecastClaim(n.remaining_ns, n.forecast_guaranteed_ns, n.elapsed_ns);
  } else if (n.state == WindowState::kClosed) {
    n.elapsed_ns = n.closed_ns - n.opened_ns;
  }
  return n;
}

absl::StatusOr<WindowOutlook> ReadOutlookLayout(const WindowLayout& l, const std::string& what) {
  WindowOutlook o;
  int tries = 0;
  while (!TryReadOutlook(l.outlook, o)) {
    if (++tries >= kMaxRetries) {
      return absl::UnavailableError(absl::StrCat(
          what, ": the writer stayed in the middle of an outlook update (did it die?)"));
    }
    BackOff(tries);
  }
  o.writer_closed = l.writer_closed.load(std::memory_order_acquire) != 0;
  return o;
}

class WriterImpl final : public WindowChannelWriter {
 public:
  // `layout` is either owned_ (in-process) or an mmap of the named channel.
  WriterImpl(std::string name, WindowLayout* layout, std::unique_ptr<WindowLayout> owned)
      : name_(std::move(name)), owned_(std::move(owned)), l_(layout) {}

  ~WriterImpl() override {
    l_->writer_closed.store(1, std::memory_order_release);
    if (!name_.empty()) {
      ::munmap(l_, sizeof(WindowLayout));
      // Unlink the name only while it is still this channel (a later writer
      // may have replaced it after MarkClosed).
      const std::string shm = ShmName(name_);
      internal::Fd fd(::shm_open(shm.c_str(), O_RDONLY, 0));
      struct stat st {};
      if (fd.valid() && ::fstat(fd.get(), &st) == 0 && st.st_ino == inode_) {
        ::shm_unlink(shm.c_str());
      }
    }
  }
  WriterImpl(const WriterImpl&) = delete;
  WriterImpl& operator=(const WriterImpl&) = delete;

  void OpenWindow(PhaseId phase, IdleKind kind, int64_t step, int ordinal,
                  int64_t now_ns) override {
    internal::NoticeRecord& r = l_->notice;
    BeginWrite(r.seq, notice_seq_);
    r.sequence.store(++sequence_, std::memory_order_relaxed);
    r.step.store(step, std::memory_order_relaxed);
    r.opened_ns.store(now_ns, std::memory_order_relaxed);
    r.closed_ns.store(0, std::memory_order_relaxed);
    r.state.store(static_cast<uint32_t>(WindowState::kOpen), std::memory_order_relaxed);
    r.phase.store(phase, std::memory_order_relaxed);
    r.kind.store(static_cast<uint32_t>(kind), std::memory_order_relaxed);
    r.ordinal.store(static_cast<uint32_t>(std::max(0, ordinal)), std::memory_order_relaxed);
    EndWrite(r.seq, notice_seq_);
    // The readers of this kind, and those of a window it replaces unclosed.
    const uint32_t bit = internal::DoorbellKindBit(kind);
    if (!name_.empty()) RingDoorbell(r.seq, open_bit_ | bit);
    open_bit_ = bit;
  }

  void CloseWindow(int64_t now_ns) override {
    internal::NoticeRecord& r = l_->notice;
    BeginWrite(r.seq, notice_seq_);
    r.sequence.store(++sequence_, std::memory_order_relaxed);
    r.closed_ns.store(now_ns, std::memory_order_relaxed);
    r.state.store(static_cast<uint32_t>(WindowState::kClosed), std::memory_order_relaxed);
    EndWrite(r.seq, notice_seq_);
    if (!name_.empty()) RingDoorbell(r.seq, open_bit_ != 0 ? open_bit_ : ~uint32_t{0});
    open_bit_ = 0;
  }

  void PublishWindowQuantiles(const PhaseCatalog& catalog,
                              const WindowQuantileTable& quantiles) override {
    internal::PhasesRecord& r = l_->phases;
    BeginWrite(r.seq, phases_seq_);
    r.num_phases.store(static_cast<uint32_t>(catalog.size()), std::memory_order_relaxed);
    for (int id = 0; id < catalog.size(); ++id) {
      const auto phase = static_cast<PhaseId>(id);
      WritePhase(r.phases[id], catalog.name(phase), catalog.idle_kind(phase),
                 quantiles[static_cast<size_t>(id)]);
    }
    WritePhase(r.phases[kBetweenStepsPhase], "", IdleKind::kHostSide,
               quantiles[kBetweenStepsPhase]);
    EndWrite(r.seq, phases_seq_);
  }

  // One phase's record: its name (NUL-padded), kind and tables.
  static void WritePhase(internal::PhaseRecord& p, const std::string& name, IdleKind kind,
                         const std::array<DurationQuantiles, kMaxWindowOrdinals>& tables) {
    char buf[internal::kPhaseNameWords * 8] = {};
    name.copy(buf, sizeof(buf) - 1);
    for (size_t i = 0; i < internal::kPhaseNameWords; ++i) {
      uint64_t w = 0;
      std::memcpy(&w, buf + 8 * i, 8);
      p.name[i].store(w, std::memory_order_relaxed);
    }
    p.kind.store(static_cast<uint32_t>(kind), std::memory_order_relaxed);
    for (int k = 0; k < kMaxWindowOrdinals; ++k) {
      const DurationQuantiles& q = tables[static_cast<size_t>(k)];
      p.samples[k].store(q.samples, std::memory_order_relaxed);
      p.claim_confidence[k].store(q.claim_confidence, std::memory_order_relaxed);
      for (int i = 0; i < kDurationQuantiles; ++i) {
        p.quantile_ns[k][i].store(q.ns[static_cast<size_t>(i)], std::memory_order_relaxed);
      }
    }
  }

  void PublishOutlook(const WindowOutlook& o) override { WriteOutlook(o, ++outlooks_); }

  // The outlook record: `o` with `sequence`.
  void WriteOutlook(const WindowOutlook& o, uint64_t sequence) {
    internal::OutlookRecord& r = l_->outlook;
    BeginWrite(r.seq, outlook_seq_);
    r.sequence.store(sequence, std::memory_order_relaxed);
    r.state.store(static_cast<uint32_t>(o.state), std::memory_order_relaxed);
    r.made_at_ns.store(o.made_at_ns, std::memory_order_relaxed);
    r.horizon_ns.store(o.horizon_ns, std::memory_order_relaxed);
    r.covered_until_ns.store(o.covered_until_ns, std::memory_order_relaxed);
    r.confidence.store(o.confidence, std::memory_order_relaxed);
    r.last_step.store(o.last_step, std::memory_order_relaxed);
    r.busy_until_ns.store(o.busy_until_ns, std::memory_order_relaxed);
    r.busy_announced_ns.store(o.busy_announced_ns, std::memory_order_relaxed);
    const int num_claims = std::clamp(o.num_claims, 0, kMaxForecastClaims);
    r.num_claims.store(static_cast<uint32_t>(num_claims), std::memory_order_relaxed);
    for (int i = 0; i < num_claims; ++i) {
      internal::ClaimRecord& out = r.claims[i];
      const ForecastClaim& c = o.claims[static_cast<size_t>(i)];
      out.step.store(c.step, std::memory_order_relaxed);
      out.guaranteed_ns.store(c.guaranteed_ns, std::memory_order_relaxed);
      out.phase.store(c.phase, std::memory_order_relaxed);
      out.kind.store(static_cast<uint16_t>(c.kind), std::memory_order_relaxed);
      out.ordinal.store(static_cast<uint16_t>(std::clamp(c.ordinal, 0, 0xffff)),
                        std::memory_order_relaxed);
    }
    for (size_t k = 0; k < o.next.size(); ++k) {
      internal::NextWindowRecord& out = r.kinds[k];
      const NextIdleWindow& n = o.next[k];
      out.state.store(static_cast<uint32_t>(n.outlook), std::memory_order_relaxed);
      out.windows.store(n.windows, std::memory_order_relaxed);
      out.earliest_start_ns.store(n.earliest_start_ns, std::memory_order_relaxed);
      out.latest_start_ns.store(n.latest_start_ns, std::memory_order_relaxed);
      out.guaranteed_ns.store(n.guaranteed_ns, std::memory_order_relaxed);
      out.expected_ns.store(n.expected_ns, std::memory_order_relaxed);
      out.step.store(n.step, std::memory_order_relaxed);
      out.last_seen_step.store(n.last_seen_step, std::memory_order_relaxed);
    }
    EndWrite(r.seq, outlook_seq_);
  }

  void MarkClosed() override {
    l_->writer_closed.store(1, std::memory_order_release);
    if (!name_.empty()) RingDoorbell(l_->notice.seq, ~uint32_t{0});
  }

  WindowNotice Latest(int64_t now_ns) const override {
    // The writer's own record is never mid-write from another thread's view
    // for long; a failure here cannot happen unless a hook is concurrently
    // interrupted forever, so fall back to an empty notice.
    static const std::string kWhat = "window channel";
    auto n = ReadLayout(*l_, now_ns, kWhat);
    return n.ok() ? *std::move(n) : WindowNotice{};
  }

  const std::string& name() const override { return name_; }

  void Init(double confidence, ino_t inode) {
    inode_ = inode;
    l_->schema_version.store(internal::kWindowSchemaVersion, std::memory_order_relaxed);
    l_->layout_bytes.store(sizeof(WindowLayout), std::memory_order_relaxed);
    l_->writer_pid.store(::getpid(), std::memory_order_relaxed);
    l_->phases.confidence.store(confidence, std::memory_order_relaxed);
    WriteOutlook(WindowOutlook{}, 0);  // no forecast yet, no kind seen
    l_->magic.store(internal::kWindowMagic, std::memory_order_release);
  }

 private:
  // Writer side of the seqlock (one writer per record; `mine` is the
  // writer's copy of the word, so it never reads the shared line): odd, then
  // the payload, then even. The release fence keeps the payload stores after
  // the odd store for any reader that sees one of them.
  static void BeginWrite(std::atomic<uint64_t>& seq, uint64_t& mine) {
    seq.store(++mine, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  static void EndWrite(std::atomic<uint64_t>& seq, uint64_t& mine) {
    seq.store(++mine, std::memory_order_release);
  }

  const std::string name_;
  ino_t inode_ = 0;  // of the shared-memory object, for the unlink
  std::unique_ptr<WindowLayout> owned_;
  WindowLayout* const l_;
  uint64_t sequence_ = 0;     // training thread
  uint64_t notice_seq_ = 0;   // training thread
  uint32_t open_bit_ = 0;     // training thread: the open window's kind bit (0: none)
  uint64_t phases_seq_ = 0;   // worker
  uint64_t outlook_seq_ = 0;  // PublishOutlook's caller
  uint64_t outlooks_ = 0;     // PublishOutlook's caller
};

class ReaderImpl final : public WindowChannelReader {
 public:
  ReaderImpl(std::string name, const WindowLayout* layout, const Clock* clock)
      : name_(std::move(name)),
        what_(absl::StrCat("window channel '", name_, "'")),
        l_(layout),
        clock_(clock) {}
  ~ReaderImpl() override {
    ::munmap(const_cast<WindowLayout*>(l_), sizeof(WindowLayout));  // NOLINT
  }
  ReaderImpl(const ReaderImpl&) = delete;
  ReaderImpl& operator=(const ReaderImpl&) = delete;

  absl::StatusOr<WindowNotice> Read() override {
    auto n = ReadLayout(*l_, clock_->NowNanos(), what_);
    if (n.ok()) last_sequence_ = n->sequence;
    return n;
  }

  absl::StatusOr<WindowNotice> WaitForNotice(absl::Duration timeout, uint32_t kinds) {
    const uint32_t bell = __atomic_load_n(Doorbell(l_->notice.seq), __ATOMIC_ACQUIRE);
    // A closed writer rings no more: the wait then lasts the whole timeout.
    if (l_->notice.sequence.load(std::memory_order_acquire) == last_sequence_ &&
        timeout > absl::ZeroDuration() && kinds != 0) {
      // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline.
      timespec now = {};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      const timespec until = absl::ToTimespec(absl::DurationFromTimespec(now) + timeout);
      if (::syscall(SYS_futex, Doorbell(l_->notice.seq), FUTEX_WAIT_BITSET, bell, &until, nullptr,
                    kinds) != 0 &&
          errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
        // No futex on this mapping (a kernel that refuses one on a read-only
        // page): sleep a poll's worth instead of returning at once.
        absl::SleepFor(std::min(timeout, absl::Microseconds(500)));
      }
    }
    return Read();
  }

  absl::StatusOr<WindowNotice> WaitForChange(absl::Duration timeout, absl::Duration poll) override {
    const int64_t start = clock_->NowNanos();
    const int64_t timeout_ns = absl::ToInt64Nanoseconds(timeout);
    const int64_t poll_ns = std::max<int64_t>(1, absl::ToInt64Nanoseconds(poll));
    // Bounded by the clock and by the number of polls, so a clock that does
    // not move (a FakeClock) cannot make the wait unbounded.
    const int64_t max_polls = timeout_ns <= 0 ? 0 : timeout_ns / poll_ns + 1;
    const uint64_t last = last_sequence_;
    for (int64_t i = 0;; ++i) {
      auto n = ReadLayout(*l_, clock_->NowNanos(), what_);
      if (!n.ok()) return n.status();
      if (n->sequence != last) {
        last_sequence_ = n->sequence;
        return n;
      }
      if (i >= max_polls || clock_->NowNanos() - start >= timeout_ns) break;
      absl::SleepFor(poll);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "window channel '", name_, "': no new notice within ", absl::FormatDuration(timeout)));
  }

  absl::StatusOr<WindowOutlook> ReadOutlook() const override {
    return ReadOutlookLayout(*l_, what_);
  }

 private:
  const std::string name_;
  const std::string what_;  // "window channel '<name>'", for errors
  const WindowLayout* const l_;
  const Clock* const clock_;
  uint64_t last_sequence_ = 0;
};

// The pid of a live writer that still owns the channel `shm`, or 0 (none,
// closed, dead, or not a channel).
int64_t LiveWriterPid(const std::string& shm) {
  internal::Fd fd(::shm_open(shm.c_str(), O_RDONLY, 0));
  if (!fd.valid()) return 0;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_size != static_cast<off_t>(sizeof(WindowLayout))) {
    return 0;
  }
  void* addr = ::mmap(nullptr, sizeof(WindowLayout), PROT_READ, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return 0;
  const auto* l = static_cast<const WindowLayout*>(addr);
  int64_t pid = 0;
  if (l->magic.load(std::memory_order_acquire) == internal::kWindowMagic &&
      l->writer_closed.load(std::memory_order_acquire) == 0) {
    pid = l->writer_pid.load(std::memory_order_relaxed);
  }
  ::munmap(addr, sizeof(WindowLayout));
  if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) return 0;
  return pid;
}

}  // namespace

void WindowChannelWriter::PublishPhases(
    const PhaseCatalog& catalog, const std::array<DurationQuantiles, kMaxPhases>& quantiles) {
  auto table = std::make_unique<WindowQuantileTable>();  // 130 KiB: not on the stack
  for (size_t p = 0; p < quantiles.size(); ++p) (*table)[p].fill(quantiles[p]);
  PublishWindowQuantiles(catalog, *table);
}

int64_t MinWindowSamples(double confidence) {
  const double c = std::clamp(confidence, 0.0, 0.999999);
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(1.0 / (1.0 - c) - 1e-9)));
}

const char* WindowStateName(WindowState state) {
  switch (state) {
    case WindowState::kOpen:
      return "open";
    case WindowState::kClosed:
      return "closed";
    case WindowState::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<std::unique_ptr<WindowChannelWriter>> WindowChannelWriter::Create(
    const std::string& name, double confidence) {
  if (auto st = ValidateChannelName(name); !st.ok()) return st;
  if (!(confidence > 0 && confidence < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("window channel confidence must be in (0, 1), got ", confidence));
  }
  const std::string shm = ShmName(name);
  if (const int64_t pid = LiveWriterPid(shm); pid > 0) {
    return absl::AlreadyExistsError(absl::StrCat("window channel '", name, "' (", shm,
                                                 ") is in use by the running process ", pid,
                                                 "; choose another window_channel_name"));
  }
  ::shm_unlink(shm.c_str());  // a channel left by a writer that died (or closed)
  internal::Fd fd(::shm_open(shm.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644));
  if (!fd.valid()) return internal::ErrnoStatus(errno, absl::StrCat("shm_open ", shm));
  if (::ftruncate(fd.get(), sizeof(WindowLayout)) != 0) {
    const int err = errno;
    ::shm_unlink(shm.c_str());
    return internal::ErrnoStatus(err, absl::StrCat("ftruncate ", shm));
  }
  void* addr =
      ::mmap(nullptr, sizeof(WindowLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    ::shm_unlink(shm.c_str());
    return internal::ErrnoStatus(err, absl::StrCat("mmap ", shm));
  }
  struct stat st {};
  ::fstat(fd.get(), &st);
  auto* layout = new (addr) WindowLayout();  // zeroed, magic 0 until Init
  auto w = std::make_unique<WriterImpl>(name, layout, nullptr);
  w->Init(confidence, st.st_ino);
  return w;
}

std::unique_ptr<WindowChannelWriter> WindowChannelWriter::CreateInProcess(double confidence) {
  auto owned = std::make_unique<WindowLayout>();
  WindowLayout* l = owned.get();
  auto w = std::make_unique<WriterImpl>("", l, std::move(owned));
  w->Init(confidence > 0 && confidence < 1 ? confidence : 0.95, 0);
  return w;
}

namespace {

// One attempt at mapping the channel `name` for reading. Unavailable while a
// writer is creating it: the object exists but is not sized yet, or its
// magic is still 0 (WindowChannelWriter::Create sizes it, maps it and then
// writes the header).
absl::StatusOr<const WindowLayout*> MapForReading(const std::string& name, const std::string& shm) {
  internal::Fd fd(::shm_open(shm.c_str(), O_RDONLY, 0));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("window channel '", name, "' (", shm,
                                              ") does not exist: is the job running with "
                                              "window_channel_name set?"));
    }
    return internal::ErrnoStatus(err, absl::StrCat("shm_open ", shm));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return internal::ErrnoStatus(errno, absl::StrCat("fstat ", shm));
  const auto want = static_cast<off_t>(sizeof(WindowLayout));
  if (st.st_size == 0) {
    return absl::UnavailableError(
        absl::StrCat("window channel '", name, "' (", shm, ") is not initialised: 0 bytes"));
  }
  if (st.st_size < static_cast<off_t>(sizeof(uint64_t) + 2 * sizeof(uint32_t))) {
    return absl::FailedPreconditionError(absl::StrCat("window channel '", name, "' (", shm,
                                                      ") is corrupt: ", st.st_size,
                                                      " bytes, expected ", want));
  }
  const auto mapped = static_cast<size_t>(std::max(st.st_size, want));
  void* addr = ::mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return internal::ErrnoStatus(errno, absl::StrCat("mmap ", shm));
  const auto* l = static_cast<const WindowLayout*>(addr);
  const uint64_t magic = l->magic.load(std::memory_order_acquire);
  absl::Status bad;
  if (magic == 0) {
    bad = absl::UnavailableError(
        absl::StrCat("window channel '", name, "' (", shm, ") is not initialised: no magic"));
  } else if (magic != internal::kWindowMagic) {
    bad = absl::FailedPreconditionError(
        absl::StrCat("window channel '", name, "' (", shm, ") is corrupt: bad magic"));
  } else if (const uint32_t version = l->schema_version.load(std::memory_order_relaxed);
             version != internal::kWindowSchemaVersion) {
    bad = absl::FailedPreconditionError(
        absl::StrCat("window channel '", name, "' (", shm, ") has schema version ", version,
                     "; this reader reads version ", internal::kWindowSchemaVersion));
  } else if (st.st_size != want ||
             l->layout_bytes.load(std::memory_order_relaxed) != sizeof(WindowLayout)) {
    bad = absl::FailedPreconditionError(absl::StrCat("window channel '", name, "' (", shm,
                                                     ") is corrupt: ", st.st_size,
                                                     " bytes, expected ", want));
  }
  if (!bad.ok()) {
    ::munmap(addr, mapped);
    return bad;
  }
  return l;
}

// How long Open waits for a writer that is creating the channel (a few
// system calls: microseconds, unless the writer died in between).
constexpr absl::Duration kCreationWait = absl::Milliseconds(200);

}  // namespace

absl::StatusOr<std::unique_ptr<WindowChannelReader>> WindowChannelReader::Open(
    const std::string& name, const Clock* clock) {
  if (auto st = ValidateChannelName(name); !st.ok()) return st;
  if (clock == nullptr) return absl::InvalidArgumentError("window channel reader: clock is null");
  const std::string shm = ShmName(name);
  // A reader started together with the writer may find the object between
  // its creation and its header: it waits (for real) for the header, reopening
  // by name (Create replaces an object left by a dead writer).
  // Once such an object was seen, its absence is a writer replacing it.
  const absl::Time until = absl::Now() + kCreationWait;
  absl::Status being_created;
  for (;;) {
    absl::StatusOr<const WindowLayout*> l = MapForReading(name, shm);
    if (l.ok()) return std::make_unique<ReaderImpl>(name, *l, clock);
    if (absl::IsUnavailable(l.status())) {
      being_created = l.status();
    } else if (being_created.ok() || !absl::IsNotFound(l.status())) {
      return l.status();
    }
    if (absl::Now() >= until) {
      return absl::FailedPreconditionError(absl::StrCat(being_created.message(), " after ",
                                                        absl::FormatDuration(kCreationWait),
                                                        " (its writer died while creating it?)"));
    }
    absl::SleepFor(absl::Microseconds(500));
  }
}

namespace internal {

absl::StatusOr<WindowNotice> WaitForNotice(WindowChannelReader& reader, absl::Duration timeout,
                                           uint32_t kinds) {
  auto* impl = dynamic_cast<ReaderImpl*>(&reader);
  if (impl == nullptr) {
    return absl::InvalidArgumentError("WaitForNotice: not a reader from WindowChannelReader::Open");
  }
  return impl->WaitForNotice(timeout, kinds);
}

}  // namespace internal

}  // namespace omni
