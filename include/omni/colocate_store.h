// The guest's view of a host on another machine: a WindowSource over the
// host's store keys (omni/sinks.h, MakeStoreSink): <prefix>/window, the last
// window notice, and <prefix>/outlook, the host's outlook.
//
// A watcher thread reads the window key every `poll` and the outlook key
// every `outlook_poll`, and keeps the window that is open now. The two hosts
// share no clock: a notice states the window's remaining duration as of its
// publication (WindowNotice::read_at_ns, the host's clock), and the reader
// knows only that it was not there when its previous read began. The source
// dates it then (the earliest it can have been published): the remainder it
// offers is the published one less the time since that read began, at most
// a poll and a read too little. A notice already in the store when the
// source starts is of unknown
// age: a window it says is open is not used (the guest waits for the next
// one). A close reaches the guest one poll (at most) after the host's worker
// published it, which is itself up to TelemetryOptions::worker_poll after
// the hooks wrote it: a guest's guard (GuestGateOptions::guard) must cover
// both, as it covers its own yield (docs/colocation.md, "A guest on another
// host").
//
//   auto store = omni::OpenStore("file:///shared/job-42/store").value();
//   auto gate = omni::colocate::GuestGate::Create({}).value();
//   omni::colocate::StoreSourceOptions o;  o.prefix = "omni/telemetry/r0";
//   auto src = omni::colocate::StoreWindowSource::Open(*store, gate.get(), o).value();
//   RunGuestLoop(*gate, *src, unit, stop, {});
//
// All times the source gives (OpenWindow, NoWindowBeforeNs, Outlook) are on
// the reader's clock (options.clock). The store's errors and malformed
// values are counted (Stats) and the last one kept; the source goes on
// reading.
//
// Thread safety: Current, WaitForChange, Outlook, NoWindowBeforeNs and Stats
// may be called from any thread; the watcher thread is started by Open and
// joined by the destructor. Without a watcher (watcher = false) the thread
// that calls WaitForChange or ReadNow reads the store.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/colocate_channel.h"
#include "omni/colocate_gate.h"
#include "omni/colocate_guest.h"
#include "omni/export.h"
#include "omni/sinks.h"
#include "omni/store.h"
#include "omni/window_channel.h"

namespace omni::colocate {

struct StoreSourceOptions {
  // The host's MakeStoreSink prefix (the keys <prefix>/window and
  // <prefix>/outlook).
  std::string prefix = "omni/telemetry";
  // How often the window key is read: a close reaches the guest up to this
  // much later (a store read is a file read or a round trip to the store's
  // server).
  absl::Duration poll = absl::Milliseconds(5);
  // How often the outlook key is read.
  absl::Duration outlook_poll = absl::Milliseconds(200);
  // The idle kinds the guest may use, a bit per IdleKind (KindBit,
  // omni/colocate_channel.h); the others count as no window.
  uint32_t kinds = ~uint32_t{0};
  // false: no watcher thread; WaitForChange's caller (or ReadNow) reads.
  bool watcher = true;
  const Clock* clock = Clock::Real();  // the reader's clock; not owned
};

struct StoreSourceStats {
  int64_t reads = 0;    // reads of the window key
  int64_t opens = 0;    // windows seen open (and used)
  int64_t stale = 0;    // windows open in the store at the first read (not used)
  int64_t skipped = 0;  // windows of a kind not in options.kinds
  int64_t closes = 0;   // closes passed to the gate
  int64_t errors = 0;   // store errors and malformed values
  absl::Status last_error;
  // The host's telemetry shut down (its last notice or outlook says so; a
  // host that restarts under the same prefix overwrites both).
  bool writer_closed = false;
};

class OMNI_EXPORT StoreWindowSource final : public WindowSource {
 public:
  // Starts reading the host's keys in `store` (not owned; must outlive the
  // source; any Store: file://, tcp://). `gate` (optional, not owned, must
  // outlive the source) receives HostClosed. InvalidArgument for poll or
  // outlook_poll <= 0, a null clock, or a prefix that makes no valid store
  // key (naming it). The keys need not exist yet.
  static absl::StatusOr<std::unique_ptr<StoreWindowSource>> Open(
      Store& store, GuestGate* gate, const StoreSourceOptions& options = {});

  ~StoreWindowSource() override;  // stops and joins the watcher
  StoreWindowSource(const StoreWindowSource&) = delete;
  StoreWindowSource& operator=(const StoreWindowSource&) = delete;

  // The window open now: its remaining duration as of as_of_ns (the
  // reader's clock; the publication, dated conservatively).
  OpenWindow Current() override;
  // True when a window opened or closed since the last Current(); waits at
  // most `timeout`.
  bool WaitForChange(absl::Duration timeout) override;
  // The host's outlook as last read, its times on the reader's clock
  // (dated like a notice). NotFound before one was read.
  absl::StatusOr<WindowOutlook> Outlook();
  // From the outlook (WindowOutlook::NoWindowBeforeNs of options.kinds); 0
  // when none was read or it states nothing.
  int64_t NoWindowBeforeNs() override;
  StoreSourceStats Stats();

  // Reads the window key (and the outlook key when due) once now: what the
  // watcher does every poll. For a source without a watcher.
  void ReadNow();

  // Use Open.
  StoreWindowSource(Store& store, GuestGate* gate, const StoreSourceOptions& options);

 private:
  // One key's reads: its last value, and when the last successful read of
  // it began.
  struct KeyReads {
    std::string last_value;
    int64_t last_started_ns = 0;
    bool read_once = false;
  };
  // A value not seen before: published at the earliest when the previous
  // successful read began; `first`: read before anything else was, of
  // unknown age.
  struct Fresh {
    std::string value;
    int64_t published_at = 0;
    bool first = false;
  };
  // One read of a key: its error, or a new value (none: absent or unchanged).
  struct KeyRead {
    absl::Status error;
    std::optional<Fresh> fresh;
  };

  void Watch();
  // Reads the keys (the outlook's when due) under read_mu_ only, so that a
  // slow store never holds up Current(), then applies what is new under mu_.
  void ReadOnce() ABSL_LOCKS_EXCLUDED(read_mu_, mu_);
  KeyRead ReadKey(const std::string& key, KeyReads& k, int64_t started)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  void TakeNotice(const Fresh& f, int64_t started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TakeOutlook(const Fresh& f, int64_t started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Apply(const WindowNotice& n, int64_t published_at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseOpen(int64_t closed_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Error(const std::string& key, const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store& store_;
  GuestGate* gate_;
  const StoreSourceOptions options_;
  const std::string window_key_, outlook_key_;
  absl::Notification stop_;
  // The store's readers (the watcher, or WaitForChange's caller, ReadNow).
  absl::Mutex read_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  KeyReads window_reads_ ABSL_GUARDED_BY(read_mu_);
  KeyReads outlook_reads_ ABSL_GUARDED_BY(read_mu_);
  int64_t next_outlook_read_ns_ ABSL_GUARDED_BY(read_mu_) = 0;
  absl::Mutex mu_;
  OpenWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // The reader's clock minus the host's (at least), from the last dated
  // notice, and when it was measured (0: never).
  int64_t offset_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t offset_at_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool have_outlook_ ABSL_GUARDED_BY(mu_) = false;
  WindowOutlook outlook_ ABSL_GUARDED_BY(mu_);  // on the reader's clock
  StoreSourceStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace omni::colocate
