// The c10d TCPStore adapter: an omni::Store served by PyTorch's TCPStore, for
// jobs that span hosts (no shared file system needed), compatible with
// torchrun's MASTER_ADDR / MASTER_PORT.
//
//   omni::torch_ext::RegisterTcpStore();                  // once, at start-up
//   auto store = omni::OpenStore("tcp://10.0.0.1:29500");    // a client
//   auto store = omni::OpenStore("tcp://0.0.0.0:29500?server=1");  // + the server
//   auto store = omni::OpenStore("env://");  // as torchrun says (see below)
//
// URIs:
//   tcp://HOST:PORT[?OPTIONS]   HOST a name, an IPv4 address or [IPv6];
//                               PORT 1..65535, or 0 with server=1 (any free
//                               port: TcpStore::port() says which).
//   env://[?OPTIONS]            HOST:PORT from MASTER_ADDR / MASTER_PORT, as
//                               torchrun and torch's env:// set them; unless
//                               `server` is given, this process starts the
//                               server when RANK is 0 and
//                               TORCHELASTIC_USE_AGENT_STORE is not "True"
//                               (then torchrun's agent already serves it),
//                               as torch's own env:// rendezvous does.
// OPTIONS, joined by '&':
//   server=1|0                  start the server in this process (default 0
//                               for tcp://); it listens on PORT on every
//                               interface (LibTorch 1.13's TCPStore has no
//                               bind address: HOST is only what clients
//                               connect to; `omni-store serve --listen
//                               HOST:PORT` binds exactly HOST) and lives as
//                               long as this Store (and any other server=1
//                               Store of this process on the same port,
//                               which shares it).
//   secret_file=PATH            the job secret's file (omni::OpenStore
//                               authenticates every record with it, see
//                               omni/auth_store.h).
//   insecure=1                  allow a host that is not loopback without a
//                               job secret (below).
//   timeout=DURATION            how long to keep trying to connect (the
//                               server may start after its clients), e.g.
//                               "500ms", "2m"; default 60s. Then Unavailable
//                               naming HOST:PORT.
// Anything else (no port, a bad port, a path, an unknown option, a missing
// or bad MASTER_ADDR / MASTER_PORT) is InvalidArgument naming the URI or
// the variable.
//
// Semantics are omni::Store's exactly (store.h), checked by the same tests
// as the FileStore. How, over c10d's primitives:
//   - TryGet never blocks: it is an atomic read done with compareSet against
//     a reserved probe value (c10d's get would wait for a missing key).
//   - Get and Wait poll (c10d check, backoff 0.1 ms .. 2 ms) instead of
//     c10d's wait: a c10d wait holds the connection for its whole duration,
//     stalling this Store's other threads, and before LibTorch 2.x a timed
//     out wait leaves the connection out of step.
//   - Add checks the current value first (InvalidArgument for a value that
//     is not a decimal int64, OutOfRange on overflow), because the server
//     drops the connection on a non-counter; counters are the decimal text
//     c10d's add writes.
//   - CompareAndSet with an empty `expected` reads first and only then
//     creates; a Set of "" by another process in between is overwritten (the
//     one case c10d cannot tell apart).
//   - A LibTorch 1.x server holds back a reply that carries an empty value
//     for ~200 ms (it sends the length with MSG_MORE and then nothing), so
//     reading a key that holds "" is that slow there. A Set of "" is
//     flushed at once (one extra round trip on 1.x).
// Keys are used as they are on the server, shared with every other c10d
// client of it (torch's process groups use their own prefixes); give omni a
// MakePrefixStore view to keep them apart. A connection lost (the server
// gone) makes every later call fail with Unavailable naming HOST:PORT;
// there is no reconnection. Before LibTorch 2.1 every c10d client also runs
// a watch-key thread that spins on a connection the server closed (this
// Store releases it at the first failed call) and that can abort the
// process when the server dies with requests of this client unread: a
// c10d defect that omni cannot catch; 2.1 removed that thread.
//
// Thread safety: every method may be called from any thread concurrently
// (calls share one connection and take turns on it). Do not use a Store
// across fork(): open a new one in the child.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/store.h"
#include "omni/torch/export.h"

namespace omni::torch_ext {

struct TcpStoreOptions {
  std::string host;        // the server's host (name or address)
  uint16_t port = 29500;   // 0 only with is_server (any free port)
  bool is_server = false;  // start the server in this process
  // How long to keep trying to connect before giving up (Unavailable).
  absl::Duration connect_timeout = absl::Seconds(60);
  // From the URI, for OpenTcpStore's check (below): the job secret's file,
  // and insecure=1 (accept a remote host without a secret).
  std::string secret_file;
  bool insecure = false;
};

// An omni::Store over c10d::TCPStore; see the top of this file.
class OMNI_TORCH_EXPORT TcpStore : public omni::Store {
 public:
  // Starts the server when `options.is_server`, then connects, retrying
  // until `connect_timeout`. InvalidArgument for an empty host, a port 0
  // without is_server or a non-positive timeout; Unavailable naming
  // host:port when the server cannot be started or reached in time.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Open(const TcpStoreOptions& options);

  const std::string& host() const { return host_; }
  // The server's port (the one picked when opened with port 0 as server).
  uint16_t port() const { return port_; }
  bool is_server() const { return is_server_; }

 protected:
  TcpStore(std::string host, uint16_t port, bool is_server)
      : host_(std::move(host)), port_(port), is_server_(is_server) {}

 private:
  const std::string host_;
  const uint16_t port_;
  const bool is_server_;
};

// The options a tcp:// or env:// URI stands for (env:// reads the
// environment now); InvalidArgument naming the URI or variable otherwise.
OMNI_TORCH_EXPORT absl::StatusOr<TcpStoreOptions> ParseTcpStoreUri(const std::string& uri);

// ParseTcpStoreUri then TcpStore::Open. A host that is not a loopback
// address (127.0.0.0/8, ::1, localhost) needs a job secret
// (omni::LoadJobSecret: secret_file=, OMNI_JOB_SECRET_FILE, OMNI_JOB_SECRET)
// or insecure=1: otherwise FailedPrecondition saying so, before connecting.
// The store returned is the raw adapter; omni::OpenStore wraps it in the
// authenticated view when the job has a secret.
OMNI_TORCH_EXPORT absl::StatusOr<std::unique_ptr<TcpStore>> OpenTcpStore(const std::string& uri);

// Registers OpenTcpStore with omni::RegisterStoreScheme for "tcp" and
// "env", so that omni::OpenStore opens them. Idempotent and thread-safe.
OMNI_TORCH_EXPORT absl::Status RegisterTcpStore();

}  // namespace omni::torch_ext
