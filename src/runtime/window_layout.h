// The shared-memory layout of a window channel (private; documented in
// docs/telemetry.md, "Window channel"). Every field is a lock-free atomic so
// that a reader in another process never races with the writer in the C++
// sense; consistency of a record is given by its seqlock word.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "omni/phase.h"
#include "omni/window_channel.h"

namespace omni::internal {

inline constexpr uint64_t kWindowMagic = 0x314e57494e4d4f00ULL;  // "\0OMNIWN1"
// 6: the gap between steps' table (phases[kBetweenStepsPhase]); 5: the
// claim confidence per window ordinal; 4: the outlook's forecast
// claims; 3: the outlook record (the forecast's next window per idle kind,
// an announced busy period) after the phase table; 2: window ordinals.
inline constexpr uint32_t kWindowSchemaVersion = 6;
inline constexpr size_t kPhaseNameWords = 6;  // 47 characters + NUL

// Seqlock: `seq` is odd while the record is being written.
struct alignas(64) NoticeRecord {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> sequence;  // notices written
  std::atomic<int64_t> step;
  std::atomic<int64_t> opened_ns;
  std::atomic<int64_t> closed_ns;
  std::atomic<uint32_t> state;  // WindowState
  std::atomic<uint32_t> phase;
  std::atomic<uint32_t> kind;     // IdleKind
  std::atomic<uint32_t> ordinal;  // which window of the phase in the step
};

struct PhaseRecord {
  std::atomic<uint64_t> name[kPhaseNameWords];  // NUL-padded bytes
  std::atomic<uint32_t> kind;
  std::atomic<int64_t> samples[kMaxWindowOrdinals];  // 0: no claim for that ordinal
  std::atomic<double> quantile_ns[kMaxWindowOrdinals][kDurationQuantiles];
  std::atomic<double> claim_confidence[kMaxWindowOrdinals];  // schema version 5
};

struct alignas(64) PhasesRecord {
  std::atomic<uint64_t> seq;
  std::atomic<double> confidence;
  std::atomic<uint32_t> num_phases;  // the catalog's
  // The catalog's phases, then (schema version 6) the gap between steps
  // (kBetweenStepsPhase: name "", kind host_side).
  PhaseRecord phases[kNoticePhases];
};

// The host's outlook (omni::WindowOutlook): per idle kind, the next window
// its latest forecast lists, and an announced busy period. Written by the
// telemetry worker and by Telemetry::AnnounceBusy, one at a time.
struct NextWindowRecord {
  std::atomic<uint32_t> state;  // KindOutlook
  std::atomic<uint32_t> reserved;
  std::atomic<int64_t> windows;  // forecast windows of the kind within the horizon
  std::atomic<int64_t> earliest_start_ns;
  std::atomic<int64_t> latest_start_ns;
  std::atomic<int64_t> guaranteed_ns;
  std::atomic<int64_t> expected_ns;
  std::atomic<int64_t> step;
  std::atomic<int64_t> last_seen_step;
};

// A forecast window a notice can be matched to (omni::ForecastClaim).
struct ClaimRecord {
  std::atomic<int64_t> step;
  std::atomic<int64_t> guaranteed_ns;
  std::atomic<uint32_t> phase;
  std::atomic<uint16_t> kind;
  std::atomic<uint16_t> ordinal;
};

struct alignas(64) OutlookRecord {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> sequence;  // outlooks written
  std::atomic<uint32_t> state;     // OutlookState
  std::atomic<uint32_t> reserved;
  std::atomic<int64_t> made_at_ns;
  std::atomic<int64_t> horizon_ns;
  std::atomic<int64_t> covered_until_ns;
  std::atomic<double> confidence;
  std::atomic<int64_t> last_step;
  std::atomic<int64_t> busy_until_ns;  // 0: none announced
  std::atomic<int64_t> busy_announced_ns;
  NextWindowRecord kinds[kNumIdleKinds];  // index: IdleKind (kNone unused)
  // Schema version 4.
  std::atomic<uint32_t> num_claims;
  std::atomic<uint32_t> reserved2;
  ClaimRecord claims[kMaxForecastClaims];
};

struct WindowLayout {
  std::atomic<uint64_t> magic;  // stored last when created
  std::atomic<uint32_t> schema_version;
  std::atomic<uint32_t> layout_bytes;  // sizeof(WindowLayout)
  std::atomic<uint32_t> writer_closed;
  std::atomic<int64_t> writer_pid;
  NoticeRecord notice;
  PhasesRecord phases;
  OutlookRecord outlook;  // schema version 3 (claims: 4)
};

// The layout is a format (docs/telemetry.md): any change needs a new
// kWindowSchemaVersion.
static_assert(offsetof(WindowLayout, schema_version) == 8);
static_assert(offsetof(WindowLayout, writer_pid) == 24);
static_assert(offsetof(WindowLayout, notice) == 64);
static_assert(offsetof(WindowLayout, phases) == 128);
static_assert(offsetof(PhasesRecord, phases) == 24 && sizeof(PhaseRecord) == 4248);
static_assert(offsetof(WindowLayout, outlook) == 140352);
static_assert(sizeof(NextWindowRecord) == 64 && offsetof(OutlookRecord, kinds) == 80);
static_assert(offsetof(OutlookRecord, num_claims) == 464 && sizeof(ClaimRecord) == 24);
static_assert(offsetof(OutlookRecord, claims) == 472);
static_assert(sizeof(WindowLayout) == 140352 + 2048);
static_assert(std::atomic<uint16_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<double>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

}  // namespace omni::internal
