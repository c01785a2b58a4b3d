#include "omni/colocate_pause.h"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fs.h"
#include "omni/clock.h"

namespace omni::colocate {

namespace {

absl::Status Signal(pid_t pid, int sig, const char* name) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("pause: bad pid ", pid));
  if (::kill(pid, sig) != 0) {
    if (errno == ESRCH) return absl::NotFoundError(absl::StrCat("no process ", pid, " to ", name));
    return internal::ErrnoStatus(errno, absl::StrCat("kill(", pid, ", ", name, ")"));
  }
  return absl::OkStatus();
}

// Polls the process state until `stopped` matches, for at most `timeout`.
absl::StatusOr<absl::Duration> WaitState(pid_t pid, bool stopped, int64_t sent_ns,
                                         absl::Duration timeout) {
  const Clock* clock = Clock::Real();
  const int64_t limit = sent_ns + absl::ToInt64Nanoseconds(timeout);
  for (;;) {
    absl::StatusOr<char> st = ProcessState(pid);
    if (!st.ok()) return st.status();
    const int64_t now = clock->NowNanos();
    const bool is_stopped = *st == 'T' || *st == 't';
    if (is_stopped == stopped) return absl::Nanoseconds(now - sent_ns);
    if (*st == 'Z' || *st == 'X') {
      return absl::FailedPreconditionError(absl::StrCat("process ", pid, " has exited"));
    }
    if (now >= limit) {
      return absl::DeadlineExceededError(absl::StrCat("process ", pid, " not ",
                                                      stopped ? "stopped" : "resumed", " within ",
                                                      absl::FormatDuration(timeout)));
    }
    timespec ts{0, 20'000};  // 20 µs between looks
    ::nanosleep(&ts, nullptr);
  }
}

// The same for the caller's child, blocking in waitpid until the kernel
// reports the stop or the continue.
absl::StatusOr<absl::Duration> WaitChild(pid_t pid, bool stopped, int64_t sent_ns) {
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &st, stopped ? WUNTRACED : WCONTINUED);
    if (r == pid && (stopped ? WIFSTOPPED(st) : WIFCONTINUED(st))) break;
    if (r == pid && (WIFEXITED(st) || WIFSIGNALED(st))) {
      return absl::FailedPreconditionError(absl::StrCat("process ", pid, " has exited"));
    }
    if (r < 0 && errno != EINTR) {
      return internal::ErrnoStatus(errno, absl::StrCat("waitpid(", pid, ")"));
    }
  }
  return absl::Nanoseconds(Clock::Real()->NowNanos() - sent_ns);
}

}  // namespace

absl::StatusOr<char> ProcessState(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no process ", pid, " (", path, ")"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state
  // follows the last ')'.
  const size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) {
    return absl::InternalError(absl::StrCat("cannot parse ", path));
  }
  return s[close + 2];
}

ProcessPauser::ProcessPauser(pid_t pid, bool is_child) : pid_(pid), is_child_(is_child) {
  have_cpu_clock_ = pid > 0 && ::clock_getcpuclockid(pid, &cpu_clock_) == 0;
}

ProcessPauser::~ProcessPauser() {
  if (paused_) ::kill(pid_, SIGCONT);
}

absl::StatusOr<absl::Duration> ProcessPauser::Pause(absl::Duration timeout) {
  const int64_t sent = Clock::Real()->NowNanos();
  if (absl::Status s = Signal(pid_, SIGSTOP, "SIGSTOP"); !s.ok()) return s;
  paused_ = true;
  if (is_child_) return WaitChild(pid_, /*stopped=*/true, sent);
  return WaitState(pid_, /*stopped=*/true, sent, timeout);
}

absl::StatusOr<absl::Duration> ProcessPauser::Resume(absl::Duration timeout) {
  const int64_t sent = Clock::Real()->NowNanos();
  if (absl::Status s = Signal(pid_, SIGCONT, "SIGCONT"); !s.ok()) return s;
  paused_ = false;
  if (is_child_) return WaitChild(pid_, /*stopped=*/false, sent);
  return WaitState(pid_, /*stopped=*/false, sent, timeout);
}

absl::StatusOr<int64_t> ProcessPauser::CpuNanos() const {
  timespec ts = {};
  if (!have_cpu_clock_ || ::clock_gettime(cpu_clock_, &ts) != 0) {
    return absl::NotFoundError(absl::StrCat("no CPU clock of process ", pid_));
  }
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace omni::colocate
