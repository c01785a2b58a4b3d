// Pausing a guest process from outside, for when a guest cannot wait for its
// next unit boundary (its units are long, or it does not use the gate).
//
// On CPUs: SIGSTOP stops every thread of the guest at once (it cannot be
// caught or ignored), and SIGCONT resumes it where it was; Pause returns when
// the kernel reports the process stopped (state 'T' in /proc/<pid>/stat), so
// the latency it returns is the time until the guest no longer runs. The
// guest's memory stays resident: pausing frees the cores, not the memory.
//
// On GPUs a stopped process's kernels already queued keep running to their
// end, so SIGSTOP alone frees the device only after the queue drains (bounded
// by the longest kernel in flight). The equivalents there:
//  - cooperative yield at a unit boundary (GuestGate): the guest stops
//    submitting work; latency ≤ one unit, the only way that also bounds the
//    queue;
//  - CUDA stream priorities (cudaStreamCreateWithPriority): the host's
//    kernels go first at block boundaries, the guest's fill in; no stop;
//  - CUDA MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, or MIG: a guest limited
//    to a share of the SMs; isolation, not a yield;
//  - a guest-side cudaDeviceSynchronize after each unit bounds the queue to
//    one unit, so SIGSTOP then frees the device within one unit.
//
// Thread safety: a ProcessPauser is used by one thread at a time.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/export.h"

namespace omni::colocate {

class OMNI_EXPORT ProcessPauser {
 public:
  // Pauses and resumes the process `pid` (the caller must be allowed to
  // signal it). Resumes it on destruction when it is paused. With
  // `is_child` (pid is the caller's child and nobody else waits for it) the
  // stop and the continue are awaited with waitpid (WUNTRACED / WCONTINUED),
  // which the kernel wakes at the change, instead of polling /proc.
  explicit ProcessPauser(pid_t pid, bool is_child = false);
  ~ProcessPauser();
  ProcessPauser(const ProcessPauser&) = delete;
  ProcessPauser& operator=(const ProcessPauser&) = delete;

  // Sends SIGSTOP and waits (polling /proc/<pid>/stat, at most `timeout`)
  // until the process is stopped; returns the time from the signal to the
  // observed stop. NotFound when the process does not exist,
  // PermissionDenied when it may not be signalled, DeadlineExceeded naming
  // the pid when it is not stopped within `timeout`.
  absl::StatusOr<absl::Duration> Pause(absl::Duration timeout = absl::Seconds(1));

  // Sends SIGCONT and waits (at most `timeout`) until the process is no
  // longer stopped; returns that time. Errors as Pause.
  absl::StatusOr<absl::Duration> Resume(absl::Duration timeout = absl::Seconds(1));

  // The CPU time the process has used, all its threads together (its
  // CPU-time clock, clock_getcpuclockid): read at the stop signal and at the
  // observed stop, it says how long the guest really ran after being told,
  // whatever the wall time until its stop was observed (a stopped process
  // must get a core once more to stop, which a woken host may keep for a
  // while). A thread running on another core counts up to the kernel's
  // last update of its time (a scheduler tick at most). NotFound when the
  // process does not exist (or its clock cannot be read).
  absl::StatusOr<int64_t> CpuNanos() const;

  bool paused() const { return paused_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
  bool is_child_;
  bool paused_ = false;
  bool have_cpu_clock_ = false;
  clockid_t cpu_clock_ = 0;  // the process's CPU-time clock
};

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...). NotFound
// when there is no such process.
OMNI_EXPORT absl::StatusOr<char> ProcessState(pid_t pid);

}  // namespace omni::colocate
