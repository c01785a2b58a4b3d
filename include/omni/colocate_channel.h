// The guest's view of a host on the same machine: a WindowSource over the
// host's live window notices (omni/window_channel.h).
//
// A watcher thread, woken by the host's notices (and every `poll` while a
// window is open), reads the host's shared-memory channel and keeps the
// window that is open now: its id (the sequence number of the
// notice that opened it), when it opened, and the remaining duration at the
// host's stated confidence, refreshed at every poll (the conditional
// quantile given the time the window has already lasted, computed by
// WindowChannelReader). When the host's notice says busy again — or a new
// window replaces an unclosed one, or the host's writer shut down — the
// watcher calls GuestGate::HostClosed with the host's close time at once, so
// that a unit still running counts as a yield (and as a deadline miss when
// it ends after the close) without waiting for the guest's next boundary.
//
//   auto gate = omni::colocate::GuestGate::Create({}).value();
//   auto src = omni::colocate::ChannelWindowSource::Open("job-42", gate.get()).value();
//   RunGuestLoop(*gate, *src, unit, stop, {});
//
// The source also reads the host's outlook (Outlook, NoWindowBeforeNs): when
// the next window of the guest's kinds can open as the host's forecast or an
// announced busy period states it, for a guest that will not wait for ever
// (GuestLoopOptions::max_wait).
//
// Times are CLOCK_MONOTONIC nanoseconds (the writer's and Clock::Real()),
// comparable on one host. A window that opened and closed before the watcher
// woke is not seen: the guest does not use it. A window of a kind the options
// leave out (ChannelSourceOptions::kinds) is no window for the guest.
//
// Thread safety: Current, WaitForChange, Outlook and NoWindowBeforeNs may be
// called from any thread;
// the watcher thread is started by Open and joined by the destructor.
// Without a watcher (ChannelSourceOptions::watcher = false) one thread at a
// time calls WaitForChange; Current and Stats may still be called from any.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "omni/colocate_gate.h"
#include "omni/colocate_guest.h"
#include "omni/export.h"
#include "omni/phase.h"
#include "omni/window_channel.h"

namespace omni::colocate {

struct ChannelSourceOptions {
  // The host's notices wake the watcher at once (WindowChannelReader::
  // WaitForNotice). Between notices it reads the channel every `poll` while a
  // window is open (the remainder shrinks; a longer window than usual makes it
  // grow) and every `closed_poll` while none is.
  absl::Duration poll = absl::Microseconds(500);
  absl::Duration closed_poll = absl::Milliseconds(50);
  // The idle kinds whose windows the guest may use, a bit per IdleKind
  // (KindBit); the others count as no window. On a CPU host only phases in
  // which the host blocks (data stalls that wait on I/O) free a core: eval
  // scoring and host-side work are CPU work there (docs/colocation.md).
  uint32_t kinds = ~uint32_t{0};
  // false: no watcher thread; the notices are read by the thread that calls
  // WaitForChange, which then sleeps on the host's doorbell itself (a
  // supervisor that only waits for opens and closes: one wake-up per notice
  // instead of two, the watcher's and its own). Current() then returns what
  // the last WaitForChange (or Open) read; HostClosed reaches the gate from
  // that thread.
  bool watcher = true;
};

constexpr uint32_t KindBit(IdleKind kind) { return uint32_t{1} << static_cast<unsigned>(kind); }

// Parses a comma-separated list of idle kind names ("data_stall,eval"; "all"
// for every kind) into KindBit flags. InvalidArgument naming an unknown kind.
OMNI_EXPORT absl::StatusOr<uint32_t> ParseKinds(const std::string& list);

struct ChannelSourceStats {
  int64_t opens = 0;        // windows seen open
  int64_t skipped = 0;      // windows of a kind not in options.kinds
  int64_t closes = 0;       // closes passed to the gate
  int64_t read_errors = 0;  // reads that found the writer mid-write (retried)
  int64_t wakeups = 0;      // times the watcher read the channel
  bool writer_closed = false;
};

class OMNI_EXPORT ChannelWindowSource final : public WindowSource {
 public:
  // Opens the host's channel `name` and starts the watcher. `gate` (optional,
  // not owned, must outlive the source) receives HostClosed. Errors: those of
  // WindowChannelReader::Open (NotFound naming the channel when no host
  // created it; InvalidArgument for a bad name; FailedPrecondition for a
  // corrupt channel or another version); InvalidArgument for poll or
  // closed_poll <= 0.
  static absl::StatusOr<std::unique_ptr<ChannelWindowSource>> Open(
      const std::string& name, GuestGate* gate, const ChannelSourceOptions& options = {});

  ~ChannelWindowSource() override;  // stops and joins the watcher
  ChannelWindowSource(const ChannelWindowSource&) = delete;
  ChannelWindowSource& operator=(const ChannelWindowSource&) = delete;

  // The window open now, with the remaining duration as of the last poll.
  OpenWindow Current() override;
  // True when a window opened or closed, or an open window's remaining
  // duration grew (a long phase proved longer than the typical one), since
  // the last Current(); waits at most `timeout`. Without a watcher it reads
  // the notices itself, and returns false at once after the host's writer
  // closed.
  bool WaitForChange(absl::Duration timeout) override;
  // "When can the next window of my kinds open?": the host's outlook read
  // now (its latest forecast's next window per idle kind, a busy period it
  // announced; omni/window_channel.h), and from it the earliest time a window
  // of options.kinds can open (WindowOutlook::NoWindowBeforeNs; 0 when the
  // host states nothing, or the channel could not be read). Any thread; a
  // few hundred nanoseconds, no system call.
  absl::StatusOr<WindowOutlook> Outlook() const;
  int64_t NoWindowBeforeNs() override;
  ChannelSourceStats Stats();

  // Use Open.
  ChannelWindowSource(std::unique_ptr<WindowChannelReader> reader, GuestGate* gate,
                      const ChannelSourceOptions& options);

 private:
  void Watch();
  // The next wait for a notice: `poll` while a window is open, else
  // `closed_poll` (with a watcher at most 50 ms).
  absl::Duration NextWait() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies a read (or its error) and counts the wake-up.
  void Take(const absl::StatusOr<WindowNotice>& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Apply(const WindowNotice& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseOpen(int64_t closed_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The watcher thread only (without one: WaitForChange's caller), but for
  // ReadOutlook, which any thread may call.
  std::unique_ptr<WindowChannelReader> reader_;
  GuestGate* gate_;
  ChannelSourceOptions options_;
  absl::Notification stop_;
  absl::Mutex mu_;
  OpenWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t skipped_seq_ ABSL_GUARDED_BY(mu_) = 0;
  ChannelSourceStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace omni::colocate
