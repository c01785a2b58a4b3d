#include "omni/colocate_store.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"

namespace omni::colocate {
namespace {

// A window notice dated within this long gives the clock offset with which
// an outlook already in the store at the first read is dated.
constexpr int64_t kOffsetValidNs = 10'000'000'000;

}  // namespace

absl::StatusOr<std::unique_ptr<StoreWindowSource>> StoreWindowSource::Open(
    Store& store, GuestGate* gate, const StoreSourceOptions& options) {
  if (options.poll <= absl::ZeroDuration() || options.outlook_poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("StoreSourceOptions.poll and outlook_poll must be positive");
  }
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("StoreSourceOptions.clock must not be null");
  }
  for (const char* key : {kWindowStoreKey, kOutlookStoreKey}) {
    if (absl::Status st = ValidateStoreKey(absl::StrCat(options.prefix, "/", key)); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("StoreSourceOptions.prefix '", options.prefix,
                                                  "': ", st.message()));
    }
  }
  return std::make_unique<StoreWindowSource>(store, gate, options);
}

StoreWindowSource::StoreWindowSource(Store& store, GuestGate* gate,
                                     const StoreSourceOptions& options)
    : store_(store),
      gate_(gate),
      options_(options),
      window_key_(absl::StrCat(options.prefix, "/", kWindowStoreKey)),
      outlook_key_(absl::StrCat(options.prefix, "/", kOutlookStoreKey)) {
  if (options_.watcher) {
    watcher_ = std::thread([this] {
      internal::NameThisThread("omni-win-store");
      Watch();
    });
  }
}

StoreWindowSource::~StoreWindowSource() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

void StoreWindowSource::Watch() {
  do {
    ReadOnce();
  } while (!stop_.WaitForNotificationWithTimeout(options_.poll));
}

void StoreWindowSource::ReadNow() { ReadOnce(); }

void StoreWindowSource::ReadOnce() {
  absl::MutexLock r(&read_mu_);
  const int64_t started = options_.clock->NowNanos();
  const KeyRead window = ReadKey(window_key_, window_reads_, started);
  std::optional<KeyRead> outlook;
  if (started >= next_outlook_read_ns_) {
    next_outlook_read_ns_ = started + absl::ToInt64Nanoseconds(options_.outlook_poll);
    outlook = ReadKey(outlook_key_, outlook_reads_, started);
  }
  absl::MutexLock l(&mu_);
  ++stats_.reads;
  if (!window.error.ok()) Error(window_key_, window.error);
  if (window.fresh.has_value()) TakeNotice(*window.fresh, started);
  if (!outlook.has_value()) return;
  if (!outlook->error.ok()) Error(outlook_key_, outlook->error);
  if (outlook->fresh.has_value()) TakeOutlook(*outlook->fresh, started);
}

StoreWindowSource::KeyRead StoreWindowSource::ReadKey(const std::string& key, KeyReads& k,
                                                      int64_t started) {
  KeyRead out;
  absl::StatusOr<std::optional<std::string>> v = store_.TryGet(key);
  if (!v.ok()) {
    out.error = v.status();
    return out;
  }
  // What the last successful read saw was there when it began: a value not
  // seen then was written after that.
  const int64_t previous = k.last_started_ns;
  const bool first = !k.read_once;
  k.last_started_ns = started;
  k.read_once = true;
  if (!v->has_value() || **v == k.last_value) return out;
  k.last_value = **std::move(v);
  out.fresh = Fresh{k.last_value, previous, first};
  return out;
}

void StoreWindowSource::Error(const std::string& key, const absl::Status& st) {
  ++stats_.errors;
  stats_.last_error = absl::Status(st.code(), absl::StrCat("store key ", key, ": ", st.message()));
}

void StoreWindowSource::TakeNotice(const Fresh& f, int64_t started) {
  absl::StatusOr<WindowNotice> n = WindowNoticeFromJson(f.value);
  if (!n.ok()) {
    Error(window_key_, n.status());
    return;
  }
  if (f.first) {
    // In the store before we looked: of unknown age. A window it says is
    // open may have closed long ago; wait for the next notice.
    if (n->state == WindowState::kOpen && (options_.kinds & KindBit(n->kind)) != 0) {
      ++stats_.stale;
    }
    last_sequence_ = n->sequence;
    if (n->writer_closed) {
      stats_.writer_closed = true;
      ++version_;
    }
    return;
  }
  offset_ns_ = f.published_at - n->read_at_ns;
  offset_at_ns_ = started;
  Apply(*n, f.published_at);
}

void StoreWindowSource::TakeOutlook(const Fresh& f, int64_t started) {
  absl::StatusOr<WindowOutlook> o = WindowOutlookFromJson(f.value);
  if (!o.ok()) {
    Error(outlook_key_, o.status());
    return;
  }
  if (o->writer_closed && !stats_.writer_closed) {  // the host's last copy: it finished
    stats_.writer_closed = true;
    CloseOpen(started);
    ++version_;
  }
  // From the host's clock to ours, dated conservatively (earlier: a "no
  // window before" moved earlier says less). An outlook already there at the
  // first read is dated by a recent window notice's offset, else not used
  // until it changes.
  int64_t offset = 0;
  if (!f.first) {
    offset = f.published_at - o->published_ns;
  } else if (offset_at_ns_ > 0 && started - offset_at_ns_ <= kOffsetValidNs) {
    offset = offset_ns_;
  } else {
    return;
  }
  outlook_ = o->ShiftedBy(offset);
  have_outlook_ = true;
}

void StoreWindowSource::CloseOpen(int64_t closed_ns) {
  if (!window_.open) return;
  if (gate_ != nullptr) gate_->HostClosed(window_.window_id, closed_ns);
  window_.open = false;
  ++stats_.closes;
  ++version_;
}

void StoreWindowSource::Apply(const WindowNotice& n, int64_t published_at) {
  // The host's time t is (at the earliest) published_at + (t - read_at) here.
  const auto here = [&](int64_t t) { return published_at + (t - n.read_at_ns); };
  if (n.sequence < last_sequence_) return;  // older than what we hold
  last_sequence_ = n.sequence;
  if (n.writer_closed) {
    if (!stats_.writer_closed) {
      stats_.writer_closed = true;
      CloseOpen(n.closed_ns > 0 ? here(n.closed_ns) : published_at);
      ++version_;
    }
    return;
  }
  if (n.state == WindowState::kClosed) {
    if (window_.open && n.sequence > window_.window_id) CloseOpen(here(n.closed_ns));
    return;
  }
  if (n.state != WindowState::kOpen) return;
  if ((options_.kinds & KindBit(n.kind)) == 0) {
    ++stats_.skipped;
    if (window_.open && n.sequence > window_.window_id) CloseOpen(here(n.opened_ns));
    return;
  }
  if (window_.open && window_.window_id == n.sequence) return;  // republished
  if (window_.open) CloseOpen(here(n.opened_ns));               // replaced; its close unseen
  window_ =
      OpenWindow{true,         n.sequence,  here(n.opened_ns), std::max<int64_t>(0, n.remaining_ns),
                 published_at, n.confidence};
  ++stats_.opens;
  ++version_;
}

OpenWindow StoreWindowSource::Current() {
  absl::MutexLock l(&mu_);
  seen_ = version_;
  return window_;
}

bool StoreWindowSource::WaitForChange(absl::Duration timeout) {
  if (options_.watcher) {
    absl::MutexLock l(&mu_);
    const uint64_t seen = seen_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ != seen; };
    return mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  }
  const Clock& clock = *options_.clock;
  const int64_t until = clock.NowNanos() + absl::ToInt64Nanoseconds(timeout);
  for (;;) {
    ReadOnce();
    {
      absl::MutexLock l(&mu_);
      if (version_ != seen_) return true;
    }
    const int64_t now = clock.NowNanos();
    if (now >= until) return false;
    clock.SleepUntil(std::min(until, now + absl::ToInt64Nanoseconds(options_.poll)));
  }
}

absl::StatusOr<WindowOutlook> StoreWindowSource::Outlook() {
  absl::MutexLock l(&mu_);
  if (!have_outlook_) {
    return absl::NotFoundError(
        absl::StrCat("no dated outlook read from store key ", outlook_key_, " yet"));
  }
  return outlook_;
}

int64_t StoreWindowSource::NoWindowBeforeNs() {
  absl::MutexLock l(&mu_);
  return have_outlook_ ? outlook_.NoWindowBeforeNs(options_.kinds) : 0;
}

StoreSourceStats StoreWindowSource::Stats() {
  absl::MutexLock l(&mu_);
  return stats_;
}

}  // namespace omni::colocate
