#include "omni/colocate_channel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/thread_name.h"
#include "runtime/window_doorbell.h"

namespace omni::colocate {

// The guest's kind flags are the bits the host's doorbell rings.
static_assert(KindBit(IdleKind::kDataStall) == internal::DoorbellKindBit(IdleKind::kDataStall) &&
              KindBit(IdleKind::kHostSide) == internal::DoorbellKindBit(IdleKind::kHostSide));

absl::StatusOr<uint32_t> ParseKinds(const std::string& list) {
  if (list == "all") return ~uint32_t{0};
  uint32_t bits = 0;
  const std::vector<std::string> names = absl::StrSplit(list, ',', absl::SkipEmpty());
  for (const std::string& name : names) {
    absl::StatusOr<IdleKind> kind = ParseIdleKind(name);
    if (!kind.ok() || *kind == IdleKind::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown idle kind '", name, "' in '", list, "' (data_stall, eval, ...)"));
    }
    bits |= KindBit(*kind);
  }
  if (bits == 0) return absl::InvalidArgumentError("empty idle kind list");
  return bits;
}

absl::StatusOr<std::unique_ptr<ChannelWindowSource>> ChannelWindowSource::Open(
    const std::string& name, GuestGate* gate, const ChannelSourceOptions& options) {
  if (options.poll <= absl::ZeroDuration() || options.closed_poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ChannelSourceOptions.poll and closed_poll must be positive");
  }
  absl::StatusOr<std::unique_ptr<WindowChannelReader>> reader = WindowChannelReader::Open(name);
  if (!reader.ok()) return reader.status();
  return std::make_unique<ChannelWindowSource>(*std::move(reader), gate, options);
}

ChannelWindowSource::ChannelWindowSource(std::unique_ptr<WindowChannelReader> reader,
                                         GuestGate* gate, const ChannelSourceOptions& options)
    : reader_(std::move(reader)), gate_(gate), options_(options) {
  if (options_.watcher) {
    watcher_ = std::thread([this] {
      internal::NameThisThread("omni-win-channel");
      Watch();
    });
  } else {
    absl::MutexLock l(&mu_);
    Take(reader_->Read());
    seen_ = version_;
  }
}

ChannelWindowSource::~ChannelWindowSource() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

absl::Duration ChannelWindowSource::NextWait() const {
  const absl::Duration wait = window_.open ? options_.poll : options_.closed_poll;
  // The watcher looks at least every 50 ms whether it should stop.
  return options_.watcher ? std::min(wait, absl::Milliseconds(50)) : wait;
}

void ChannelWindowSource::Take(const absl::StatusOr<WindowNotice>& n) {
  ++stats_.wakeups;
  if (n.ok()) {
    Apply(*n);
  } else {
    ++stats_.read_errors;
  }
}

void ChannelWindowSource::Watch() {
  // The host's notices wake the watcher at once (the channel's doorbell);
  // between them it wakes every `poll` while a window is open (to refresh its
  // remainder) and every `closed_poll` otherwise, and at least every 50 ms to
  // see whether it should stop.
  absl::StatusOr<WindowNotice> n = reader_->Read();
  for (;;) {
    absl::Duration wait;
    bool writer_closed = false;
    {
      absl::MutexLock l(&mu_);
      Take(n);
      wait = NextWait();
      writer_closed = stats_.writer_closed;
    }
    if (stop_.HasBeenNotified()) return;
    if (writer_closed) {  // no more notices: wait only to be stopped
      stop_.WaitForNotification();
      return;
    }
    n = internal::WaitForNotice(*reader_, wait, options_.kinds);
  }
}

void ChannelWindowSource::CloseOpen(int64_t closed_ns) {
  if (!window_.open) return;
  if (gate_ != nullptr) gate_->HostClosed(window_.window_id, closed_ns);
  window_.open = false;
  ++stats_.closes;
  ++version_;
}

void ChannelWindowSource::Apply(const WindowNotice& n) {
  if (n.writer_closed) {
    if (!stats_.writer_closed) {
      stats_.writer_closed = true;
      CloseOpen(n.closed_ns > 0 ? n.closed_ns : n.read_at_ns);
      ++version_;
    }
    return;
  }
  if (n.state == WindowState::kClosed) {
    // The close of the window we hold, or of a later one we never saw open.
    if (window_.open && n.sequence > window_.window_id) CloseOpen(n.closed_ns);
    return;
  }
  if (n.state != WindowState::kOpen) return;
  if ((options_.kinds & KindBit(n.kind)) == 0) {
    // Not a window for this guest: the one we held (if any) has ended.
    if (n.sequence > skipped_seq_) {
      skipped_seq_ = n.sequence;
      ++stats_.skipped;
    }
    if (window_.open && n.sequence > window_.window_id) CloseOpen(n.opened_ns);
    return;
  }
  const int64_t remaining = n.remaining_ns > 0 ? n.remaining_ns : 0;
  if (window_.open && window_.window_id == n.sequence) {
    // The same window: refresh its remainder. Wake a waiting guest only when
    // it grew beyond what the last statement still promised.
    const int64_t promised = window_.remaining_ns - (n.read_at_ns - window_.as_of_ns);
    window_.remaining_ns = remaining;
    window_.as_of_ns = n.read_at_ns;
    window_.confidence = n.confidence;
    if (remaining > promised + 1'000'000) ++version_;
    return;
  }
  if (n.sequence < window_.window_id) return;  // older than the window we hold
  if (window_.open) CloseOpen(n.opened_ns);    // replaced by a newer one, its close unseen
  window_ = OpenWindow{true, n.sequence, n.opened_ns, remaining, n.read_at_ns, n.confidence};
  ++stats_.opens;
  ++version_;
}

OpenWindow ChannelWindowSource::Current() {
  absl::MutexLock l(&mu_);
  seen_ = version_;
  return window_;
}

bool ChannelWindowSource::WaitForChange(absl::Duration timeout) {
  if (options_.watcher) {
    absl::MutexLock l(&mu_);
    const uint64_t seen = seen_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ != seen; };
    return mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  }
  // No watcher: this thread sleeps on the host's doorbell and applies what
  // it reads.
  const absl::Time until = absl::Now() + timeout;
  for (;;) {
    absl::Duration wait;
    {
      absl::MutexLock l(&mu_);
      if (version_ != seen_) return true;
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration() || stats_.writer_closed) return false;
      wait = std::min(left, NextWait());
    }
    const absl::StatusOr<WindowNotice> n = internal::WaitForNotice(*reader_, wait, options_.kinds);
    absl::MutexLock l(&mu_);
    Take(n);
  }
}

absl::StatusOr<WindowOutlook> ChannelWindowSource::Outlook() const {
  return reader_->ReadOutlook();
}

int64_t ChannelWindowSource::NoWindowBeforeNs() {
  const absl::StatusOr<WindowOutlook> o = reader_->ReadOutlook();
  return o.ok() ? o->NoWindowBeforeNs(options_.kinds) : 0;
}

ChannelSourceStats ChannelWindowSource::Stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

}  // namespace omni::colocate
