// omni-store: the job's rendezvous store as its own process (a sidecar), the
// way torchrun's agent hosts the c10d store, so that the store outlives any
// one trainer.
//
//   omni-store serve --listen HOST:PORT
//
// Serves a c10d TCPStore (LibTorch's, so this tool links omni::torch; the
// core-only `omni` CLI does not) on exactly HOST:PORT (PORT 0: any free
// port), prints one JSON line {"listening": "HOST:PORT"} once clients can
// connect, and exits 0 on SIGTERM or SIGINT. Exit 2 for bad usage, 1 when
// the server cannot start.
//
// The store needs no secret: with a job secret (docs/elastic.md, "Threat
// model") the clients seal and verify every record end to end, and the
// server only relays them; it could not forge one.
//
// What is bound: LibTorch 1.13's TCPStore has no bind address (its server
// binds the wildcard address of getaddrinfo(NULL, port, AI_PASSIVE)). This
// program defines bind() itself, which the dynamic linker resolves before
// libc's for LibTorch too (the executable comes first in the lookup order;
// the symbol is exported with --export-dynamic-symbol): a bind to the
// wildcard address becomes a bind to HOST, and one of the other address
// family fails with EAFNOSUPPORT, so that c10d moves on to HOST's family.
// Nothing else in this process binds.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "omni/torch/store.h"

namespace {

// The address every wildcard bind of this process is turned into; family
// AF_UNSPEC until main has resolved --listen.
sockaddr_storage g_bind_to{};
socklen_t g_bind_to_len = 0;

bool IsWildcard(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (addr->sa_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
    return std::memcmp(&a, &in6addr_any, sizeof(a)) == 0;
  }
  return false;
}

using BindFn = int (*)(int, const sockaddr*, socklen_t);

int Usage() {
  std::fprintf(stderr,
               "usage: omni-store serve --listen HOST:PORT\n"
               "  Serves the job's c10d TCPStore on exactly HOST:PORT (PORT 0: any free port)\n"
               "  until SIGTERM or SIGINT; prints {\"listening\": \"HOST:PORT\"} when ready.\n");
  return 2;
}

}  // namespace

// The interposer (see the top of this file).
extern "C" __attribute__((visibility("default"))) int bind(int fd, const sockaddr* addr,
                                                           socklen_t len) {
  static const auto real = reinterpret_cast<BindFn>(dlsym(RTLD_NEXT, "bind"));
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  if (g_bind_to.ss_family == AF_UNSPEC || addr == nullptr || !IsWildcard(addr)) {
    return real(fd, addr, len);
  }
  if (addr->sa_family != g_bind_to.ss_family) {
    errno = EAFNOSUPPORT;
    return -1;
  }
  sockaddr_storage to = g_bind_to;
  if (to.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&to)->sin_port =
        reinterpret_cast<const sockaddr_in*>(addr)->sin_port;
  } else {
    reinterpret_cast<sockaddr_in6*>(&to)->sin6_port =
        reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port;
  }
  return real(fd, reinterpret_cast<const sockaddr*>(&to), g_bind_to_len);
}

int main(int argc, char** argv) {
  if (argc != 4 || std::string(argv[1]) != "serve" || std::string(argv[2]) != "--listen") {
    return Usage();
  }
  const std::string listen = argv[3];
  std::string host;
  std::string port_text;
  if (!listen.empty() && listen[0] == '[') {
    const auto close = listen.find("]:");
    if (close == std::string::npos) return Usage();
    host = listen.substr(1, close - 1);
    port_text = listen.substr(close + 2);
  } else {
    const auto colon = listen.rfind(':');
    if (colon == std::string::npos || listen.find(':') != colon) return Usage();
    host = listen.substr(0, colon);
    port_text = listen.substr(colon + 1);
  }
  uint32_t port = 0;
  if (host.empty() || !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    std::fprintf(stderr, "omni-store: --listen '%s' is not HOST:PORT (PORT 0..65535)\n",
                 listen.c_str());
    return 2;
  }
  // The address to bind: HOST resolved (a name gives its first address).
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    std::fprintf(stderr, "omni-store: cannot resolve '%s': %s\n", host.c_str(), gai_strerror(rc));
    return 2;
  }
  std::memcpy(&g_bind_to, found->ai_addr, found->ai_addrlen);
  g_bind_to_len = found->ai_addrlen;
  ::freeaddrinfo(found);

  // SIGTERM and SIGINT are taken by sigwait below, in every thread.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  omni::torch_ext::TcpStoreOptions options;
  options.host = host;
  options.port = static_cast<uint16_t>(port);
  options.is_server = true;
  absl::StatusOr<std::unique_ptr<omni::torch_ext::TcpStore>> store =
      omni::torch_ext::TcpStore::Open(options);
  if (!store.ok()) {
    std::fprintf(stderr, "omni-store: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  const std::string where = host.find(':') == std::string::npos
                                ? absl::StrCat(host, ":", (*store)->port())
                                : absl::StrCat("[", host, "]:", (*store)->port());
  std::printf("{\"listening\": \"%s\"}\n", where.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::fprintf(stderr, "omni-store: %s: stopping the store on %s\n", strsignal(sig), where.c_str());
  return 0;
}
