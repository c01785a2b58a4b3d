// gloo's event loop and a connection reset while it was being set up.
//
// Debian's gloo (0.0~git20220518) completes a pair's connection on its event
// loop thread and asks the socket for its peer's address there
// (tcp::Pair::handleConnected -> Address::fromPeerName). When the peer has
// already reset the connection (it was killed, or it closed its listening
// socket with this connection in its backlog: a replica that gave up on a
// generation), getpeername fails with ENOTCONN and gloo throws
// gloo::EnforceNotMet on its own thread, where nothing catches it: the whole
// process aborts (SIGABRT). The elastic soak saw it (docs/elastic.md, "Open
// findings"). Later gloo reads the peer's name with a fallback
// (Socket::safePeerName).
//
// This definition of getpeername interposes the C library's for the
// process's executable and the libraries it links (libomni_core comes before
// libc in their search order). It is the system call unchanged, except for a
// call from libgloo that fails with ENOTCONN: gloo is then given the socket's
// own address family with a zero address, the pair counts as connected, and
// its first read or write fails with the connection's real error, an I/O
// error on the thread that waits for the pair, which omni handles (a
// collective or a rendezvous that fails; the group recovers). Every other
// caller sees ENOTCONN as before. A Python process loads libomni_core
// privately (RTLD_LOCAL): there the C library's definition stays in force.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "omni/export.h"

namespace {

bool CalledFromGloo(const void* return_address) {
  Dl_info info{};
  return ::dladdr(return_address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "libgloo") != nullptr;
}

}  // namespace

extern "C" OMNI_EXPORT int getpeername(int fd, struct sockaddr* addr, socklen_t* len) {
  const long rv = ::syscall(SYS_getpeername, fd, addr, len);  // NOLINT(google-runtime-int)
  if (rv == 0 || errno != ENOTCONN || addr == nullptr || len == nullptr ||
      !CalledFromGloo(__builtin_return_address(0))) {
    return static_cast<int>(rv);
  }
  const int not_connected = errno;
  sockaddr_storage self{};
  socklen_t n = sizeof(self);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &n) != 0) {
    errno = not_connected;
    return -1;
  }
  sockaddr_storage none{};
  none.ss_family = self.ss_family;
  std::memcpy(addr, &none, std::min(*len, n));
  *len = n;
  return 0;
}
