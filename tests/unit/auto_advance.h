// Fake time for tests of code that waits in threads of its own (membership
// heartbeats, joins, recoveries, elastic groups): AutoAdvance moves a
// FakeClock to the next deadline that a thread waits for on it whenever
// every other thread of this process is blocked — on the clock, a mutex, a
// socket or a real-time timer. Computing takes no fake time and waiting takes
// what the deadlines say, however loaded the machine is: a thread that is
// ready to run but gets no CPU is not blocked, so a starved heartbeat thread
// never misses a beat in fake time. A test that waits for time to pass
// sleeps on the clock (clock.SleepFor) and wakes once the others have done
// what they do in that time.
//
// "Blocked" is read from Linux's /proc/self/task: in two scans one after the
// other, no thread but the driver is running or runnable (state R) or in an
// uninterruptible wait (D, e.g. disk I/O). A thread that wakes on a real-time
// timer and sleeps again between the scans (gloo's event loop and its
// ticker, which tick every 100 us while a communicator connects) counts as
// blocked: otherwise fake time could not pass while a real-time wait goes on
// beside it, and a replica waiting on the clock (a recovery's next look at
// the store) would hold up a peer connecting to it until the connect's
// real-time timeout. The price: threads that run in short bursts between
// such wake-ups (two handing work back and forth) may be seen blocked in
// both scans and see the clock move by one deadline meanwhile, as real time
// would. A thread that never blocks (a spin) holds fake time still.
//
// Thread safety: construct and destroy on one thread; the clock may be used
// from any thread meanwhile. Declare it after the clock and before anything
// that waits on the clock, so that it stops after those.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "omni/clock.h"

namespace omni::test_util {

class AutoAdvance {
 public:
  explicit AutoAdvance(FakeClock& clock) : clock_(clock), thread_([this] { Run(); }) {}
  ~AutoAdvance() {
    stop_.store(true);
    thread_.join();
  }
  AutoAdvance(const AutoAdvance&) = delete;
  AutoAdvance& operator=(const AutoAdvance&) = delete;

 private:
  // The state letter of thread `tid` (/proc/self/task/<tid>/stat); 0 when it
  // is gone.
  static char State(const char* tid) {
    const std::string path = std::string("/proc/self/task/") + tid + "/stat";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n <= 0) return 0;
    const std::string stat(buf, static_cast<size_t>(n));
    // "<tid> (<name>) <state> ...": the name may hold spaces and parentheses.
    const size_t paren = stat.rfind(')');
    return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
  }

  // True when no thread of this process but `self` is running, runnable or
  // in an uninterruptible wait.
  static bool Blocked(long self) {
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return false;
    bool blocked = true;
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      if (std::strtol(e->d_name, nullptr, 10) == self) continue;
      const char state = State(e->d_name);
      if (state == 'R' || state == 'D') {
        blocked = false;
        break;
      }
    }
    ::closedir(dir);
    return blocked;
  }

  void Run() {
    const long self = ::syscall(SYS_gettid);
    // The driver's own pause between looks, longer while the others compute.
    std::chrono::microseconds pause(20);
    while (!stop_.load()) {
      if (clock_.NextWakeNanos().has_value() && Blocked(self) && Blocked(self)) {
        clock_.AdvanceToNextWake();
        pause = std::chrono::microseconds(20);
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  FakeClock& clock_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts once the rest is initialised
};

}  // namespace omni::test_util
