// The window channel's doorbell (internal to omni_core; used by
// omni::colocate::ChannelWindowSource): after each notice a named channel's
// writer wakes the readers waiting on it, a futex on the notice record's
// seqlock word shared between processes (docs/telemetry.md), so a reader
// sleeps between notices instead of polling.
//
// Thread safety: as WindowChannelReader (one thread at a time per reader).
#pragma once

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/export.h"
#include "omni/phase.h"
#include "omni/window_channel.h"

namespace omni::internal {

// The doorbell's bit for an idle kind: the writer rings the bits of the
// window a notice opens or closes (and of an unclosed one it replaces; every
// bit when it shuts down), a futex bitset wake-up.
constexpr uint32_t DoorbellKindBit(IdleKind kind) {
  return uint32_t{1} << static_cast<unsigned>(kind);
}

// Sleeps until the writer of `reader`'s channel writes a notice about a
// window of one of `kinds` (DoorbellKindBit flags; ~0 for any), at most
// `timeout`, unless a notice newer than the last one the reader returned is
// already there (of any kind); then returns the current notice as Read does
// (after a timeout too). Errors as Read; InvalidArgument for a reader that
// WindowChannelReader::Open did not make.
OMNI_EXPORT absl::StatusOr<WindowNotice> WaitForNotice(WindowChannelReader& reader,
                                                       absl::Duration timeout,
                                                       uint32_t kinds = ~uint32_t{0});

}  // namespace omni::internal
