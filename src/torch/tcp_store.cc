// omni::torch_ext::TcpStore: omni::Store over c10d::TCPStore (see
// omni/torch/store.h for the semantics and why each call is built the way it
// is).
//
// What c10d's server does (the same in LibTorch 1.13 and 2.x, classic and
// libuv backends), which the mapping below relies on:
//   compareSet(k, e, d)  k missing: e empty -> stores d, returns d;
//                                   e not empty -> stores nothing, returns e.
//                        k present: value == e -> stores d; returns the
//                                   value now stored.
//   add(k, n)            parses the value with std::stoll (a non-counter
//                        makes the server drop the connection), stores the
//                        sum as decimal text.
//   check(keys)          true when every key exists; never blocks.
//   get(k), wait(keys)   block (client side) until the keys exist; not used.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "omni/auth_store.h"
#include "omni/torch/store.h"

static_assert(TORCH_VERSION_MAJOR > 1 || (TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR >= 13),
              "the TCPStore adapter needs LibTorch 1.13 or newer (compareSet create-if-absent)");

namespace omni::torch_ext {
namespace {

constexpr absl::Duration kMinBackoff = absl::Microseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(2);
// Between connection attempts while the server is not up yet.
constexpr absl::Duration kMinConnectBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxConnectBackoff = absl::Seconds(1);
constexpr char kUriForm[] = "expected tcp://host:port[?server=1&timeout=60s] or env://[?...]";

// The two probe values of TryGet: no real value is expected to be either
// (they start with a NUL), and a key would have to change from the first
// to the second between two round trips to be misread as missing.
constexpr char kProbe1[] = "\0omni.tcpstore.absent.probe.1";
constexpr char kProbe2[] = "\0omni.tcpstore.absent.probe.2";

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string String(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

const std::vector<uint8_t>& Probe1() {
  static const std::vector<uint8_t> bytes(kProbe1, kProbe1 + sizeof(kProbe1) - 1);
  return bytes;
}
const std::vector<uint8_t>& Probe2() {
  static const std::vector<uint8_t> bytes(kProbe2, kProbe2 + sizeof(kProbe2) - 1);
  return bytes;
}

std::string ExceptionMessage(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

std::string HostPort(const std::string& host, uint16_t port) {
  return host.find(':') == std::string::npos ? absl::StrCat(host, ":", port)
                                             : absl::StrCat("[", host, "]:", port);
}

// A loopback address (127.0.0.0/8, ::1) or "localhost": only this host reaches it.
bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  return ::inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

class TcpStoreImpl final : public TcpStore {
 public:
  TcpStoreImpl(c10::intrusive_ptr<c10d::TCPStore> store, std::string host, uint16_t port,
               bool is_server)
      : TcpStore(std::move(host), port, is_server),
        label_(absl::StrCat("TcpStore ", HostPort(this->host(), this->port()))),
        store_(std::move(store)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<bool>("set", key,
                      [&](c10d::TCPStore& s) {
                        s.set(key, Bytes(value));
#if TORCH_VERSION_MAJOR < 2
                        // 1.x sends the key with MSG_MORE and nothing after
                        // an empty value, so the request sits in the kernel
                        // for 200 ms; a check flushes it at once.
                        if (value.empty()) s.check({key});
#endif
                        return true;
                      })
        .status();
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Read(key);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::optional<std::string>> current = Read(key);
    if (!current.ok()) return current.status();
    if (current->has_value()) {
      int64_t value = 0;
      if (!absl::SimpleAtoi(**current, &value)) {
        return absl::InvalidArgumentError(absl::StrCat(label_, ": key '", key, "' holds '",
                                                       absl::CHexEscape(current->value()),
                                                       "', not a counter"));
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(value, delta, &sum)) {
        return absl::OutOfRangeError(
            absl::StrCat(label_, ": key '", key, "': ", value, " + ", delta, " overflows int64"));
      }
    }
    return Call<int64_t>("add", key, [&](c10d::TCPStore& s) { return s.add(key, delta); });
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    if (expected.empty()) {
      // Create if absent. c10d would also swap an existing "" for `desired`,
      // which an empty `expected` must never match: read first.
      absl::StatusOr<std::optional<std::string>> current = Read(key);
      if (!current.ok()) return current.status();
      if (current->has_value()) return std::move(**current);
      return CompareSet(key, Bytes(expected), Bytes(desired));
    }
    absl::StatusOr<std::string> result = CompareSet(key, Bytes(expected), Bytes(desired));
    if (!result.ok() || *result != expected) return result;
    // c10d answers `expected` both for a missing key and (when expected ==
    // desired) for a matching one. With expected != desired a match would
    // have answered `desired`, so the key is missing; otherwise read.
    if (expected == desired) {
      absl::StatusOr<std::optional<std::string>> current = Read(key);
      if (!current.ok()) return current.status();
      if (current->has_value()) return std::move(**current);
    }
    return absl::NotFoundError(
        absl::StrCat(label_, ": compare-and-set of missing key '", key, "' expected a value"));
  }

  Exposure exposure() const override {
    Exposure e;
    if (!IsLoopbackHost(host())) e.remote = absl::StrCat("connects to ", HostPort(host(), port()));
    if (is_server()) {
      e.wildcard = absl::StrCat("serves port ", port(),
                                " on every interface (LibTorch 1.13's TCPStore has no bind "
                                "address; omni-store serve --listen HOST:PORT binds one)");
    }
    return e;
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<bool>("delete", key, [&](c10d::TCPStore& s) { return s.deleteKey(key); });
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = kMinBackoff;
    for (;;) {
      absl::StatusOr<bool> exists = Check({key});
      if (!exists.ok()) return exists.status();
      if (*exists) {
        // Deleted in between: keep waiting.
        absl::StatusOr<std::optional<std::string>> value = Read(key);
        if (!value.ok()) return value.status();
        if (value->has_value()) return std::move(**value);
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            label_, ": key '", key, "' still missing after ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(std::min(backoff, left));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    for (const std::string& key : keys) {
      if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    }
    if (keys.empty()) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = kMinBackoff;
    for (;;) {
      absl::StatusOr<bool> all = Check(keys);
      if (!all.ok()) return all.status();
      if (*all) return absl::OkStatus();
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      absl::SleepFor(std::min(backoff, left));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      absl::StatusOr<bool> exists = Check({key});
      if (!exists.ok()) return exists.status();
      if (!*exists) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();  // all there by now
    return absl::DeadlineExceededError(
        absl::StrCat(label_, ": key(s) '", absl::StrJoin(missing, "', '"), "' still missing after ",
                     absl::FormatDuration(timeout)));
  }

 private:
  // Runs `op` on the c10d store, one call at a time. Any exception (c10d
  // throws on I/O and protocol errors) leaves the connection in an unknown
  // state: it becomes Unavailable, latched for every later call.
  template <typename T, typename Op>
  absl::StatusOr<T> Call(const char* what, const std::string& key, Op&& op)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!broken_.empty()) {
      return absl::UnavailableError(absl::StrCat(label_, ": ", what, " of key '", key,
                                                 "': the connection failed earlier: ", broken_));
    }
    try {
      return T(op(*store_));
    } catch (...) {
      broken_ =
          absl::StrCat(what, " of key '", key, "': ", ExceptionMessage(std::current_exception()));
    }
    // A client lets the c10d store go now: before LibTorch 2.1 its watch-key
    // thread spins on a connection the server closed until it is destroyed.
    // A server stays up for its other clients.
    if (!is_server()) store_.reset();
    return absl::UnavailableError(absl::StrCat(label_, ": ", broken_));
  }

  // An atomic, non-blocking read (see kProbe1).
  absl::StatusOr<std::optional<std::string>> Read(const std::string& key) {
    for (const std::vector<uint8_t>* probe : {&Probe1(), &Probe2()}) {
      absl::StatusOr<std::vector<uint8_t>> value = Call<std::vector<uint8_t>>(
          "read", key, [&](c10d::TCPStore& s) { return s.compareSet(key, *probe, *probe); });
      if (!value.ok()) return value.status();
      if (*value != *probe) return std::optional<std::string>(String(*value));
    }
    return std::optional<std::string>();
  }

  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::vector<uint8_t>& expected,
                                         const std::vector<uint8_t>& desired) {
    absl::StatusOr<std::vector<uint8_t>> value = Call<std::vector<uint8_t>>(
        "compare-and-set", key,
        [&](c10d::TCPStore& s) { return s.compareSet(key, expected, desired); });
    if (!value.ok()) return value.status();
    return String(*value);
  }

  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) {
    return Call<bool>("check", absl::StrJoin(keys, "', '"),
                      [&](c10d::TCPStore& s) { return s.check(keys); });
  }

  const std::string label_;  // "TcpStore host:port", the prefix of every error
  absl::Mutex mu_;
  c10::intrusive_ptr<c10d::TCPStore> store_ ABSL_GUARDED_BY(mu_);  // null once a client broke
  std::string broken_ ABSL_GUARDED_BY(mu_);  // the first failure; empty while healthy
};

absl::Status BadUri(const std::string& uri, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("store URI '", absl::CHexEscape(uri), "' ", why, "; ", kUriForm));
}

// A port number "0".."65535".
std::optional<uint16_t> ParsePort(const std::string& text) {
  if (text.empty() || text.size() > 5 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  const int value = std::stoi(text);
  if (value > 65535) return std::nullopt;
  return static_cast<uint16_t>(value);
}

std::optional<std::string> GetEnv(const char* name) {
  const char* value = std::getenv(name);  // read at open, never cached
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

absl::StatusOr<TcpStoreOptions> ParseTcpStoreUri(const std::string& uri) {
  const std::string::size_type sep = uri.find("://");
  if (sep == std::string::npos) return BadUri(uri, "has no scheme");
  const std::string scheme = uri.substr(0, sep);
  std::string rest = uri.substr(sep + 3);
  std::string query;
  if (const auto q = rest.find('?'); q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }

  TcpStoreOptions options;
  std::optional<bool> server;
  const std::vector<std::string> items = absl::StrSplit(query, '&', absl::SkipEmpty());
  for (const std::string& item : items) {
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (name == "server") {
      if (value == "1" || value == "true") {
        server = true;
      } else if (value == "0" || value == "false") {
        server = false;
      } else {
        return BadUri(uri,
                      absl::StrCat("has server='", absl::CHexEscape(value), "' (expected 1 or 0)"));
      }
    } else if (name == "secret_file") {
      if (value.empty()) return BadUri(uri, "has an empty secret_file");
      options.secret_file = value;
    } else if (name == "insecure") {
      if (value != "1" && value != "true") {
        return BadUri(uri,
                      absl::StrCat("has insecure='", absl::CHexEscape(value), "' (expected 1)"));
      }
      options.insecure = true;
    } else if (name == "timeout") {
      absl::Duration timeout;
      if (!absl::ParseDuration(value, &timeout) || timeout <= absl::ZeroDuration() ||
          timeout == absl::InfiniteDuration()) {
        return BadUri(uri, absl::StrCat("has timeout='", absl::CHexEscape(value),
                                        "' (expected a positive duration such as 30s)"));
      }
      options.connect_timeout = timeout;
    } else {
      return BadUri(uri, absl::StrCat("has an unknown option '", absl::CHexEscape(name),
                                      "' (known: server, timeout, secret_file, insecure)"));
    }
  }

  if (scheme == "env") {
    if (!rest.empty()) return BadUri(uri, "names a host; env:// takes it from MASTER_ADDR");
    const std::optional<std::string> addr = GetEnv("MASTER_ADDR");
    if (!addr.has_value() || addr->empty()) {
      return BadUri(uri, "needs MASTER_ADDR in the environment (as torchrun sets it)");
    }
    const std::optional<std::string> port_text = GetEnv("MASTER_PORT");
    const std::optional<uint16_t> port =
        port_text.has_value() ? ParsePort(*port_text) : std::nullopt;
    if (!port.has_value() || *port == 0) {
      return BadUri(
          uri,
          absl::StrCat("needs MASTER_PORT in the environment as a port 1..65535 (it is ",
                       port_text.has_value() ? absl::StrCat("'", absl::CHexEscape(*port_text), "'")
                                             : std::string("unset"),
                       ")"));
    }
    options.host = *addr;
    if (options.host.size() > 2 && options.host.front() == '[' && options.host.back() == ']') {
      options.host = options.host.substr(1, options.host.size() - 2);
    }
    options.port = *port;
    if (server.has_value()) {
      options.is_server = *server;
    } else {
      // As torch's env:// rendezvous: rank 0 serves, unless torchrun's agent does.
      options.is_server = GetEnv("RANK").value_or("") == "0" &&
                          GetEnv("TORCHELASTIC_USE_AGENT_STORE").value_or("") != "True";
    }
    return options;
  }
  if (scheme != "tcp")
    return BadUri(uri, absl::StrCat("has scheme '", absl::CHexEscape(scheme), "'"));

  if (rest.find('/') != std::string::npos) return BadUri(uri, "has a path");
  std::string port_text;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':') {
      return BadUri(uri, "has no ]:port after an IPv6 address");
    }
    options.host = rest.substr(1, close - 1);
    port_text = rest.substr(close + 2);
  } else {
    const auto colon = rest.find(':');
    if (colon == std::string::npos) return BadUri(uri, "has no port");
    if (rest.find(':', colon + 1) != std::string::npos) {
      return BadUri(uri, "has more than one ':' (write an IPv6 address as [addr]:port)");
    }
    options.host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (options.host.empty()) return BadUri(uri, "has no host");
  const std::optional<uint16_t> port = ParsePort(port_text);
  if (!port.has_value()) {
    return BadUri(uri,
                  absl::StrCat("has port '", absl::CHexEscape(port_text), "' (expected 0..65535)"));
  }
  options.port = *port;
  options.is_server = server.value_or(false);
  if (options.port == 0 && !options.is_server) {
    return BadUri(uri, "has port 0, which only a server (server=1) may ask for");
  }
  return options;
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Open(const TcpStoreOptions& options) {
  const std::string where = HostPort(options.host, options.port);
  if (options.host.empty()) return absl::InvalidArgumentError("TcpStore: the host is empty");
  if (options.port == 0 && !options.is_server) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore ", where, ": port 0 needs is_server (any free port)"));
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.connect_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("TcpStore ", where, ": connect timeout ",
                                                   absl::FormatDuration(options.connect_timeout),
                                                   " is not a positive, finite duration"));
  }

  c10d::TCPStoreOptions opts;
  opts.port = options.port;
  opts.isServer = options.is_server;
  opts.waitWorkers = false;  // membership is the caller's business, not the constructor's
  // Another server=1 store of this process on the same port (or torch's own
  // env:// store) shares one server, as torch's rendezvous does.
  opts.multiTenant = true;

  const absl::Time deadline = absl::Now() + options.connect_timeout;
  absl::Duration backoff = kMinConnectBackoff;
  for (int attempt = 1;; ++attempt) {
    // c10d's connect timeout has whole seconds; round up, at least 1 s.
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Seconds(1));
    opts.timeout = std::chrono::seconds(absl::ToInt64Seconds(absl::Ceil(left, absl::Seconds(1))));
    std::string error;
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(options.host, opts);
      const uint16_t port = store->getPort();
      return std::unique_ptr<TcpStore>(
          std::make_unique<TcpStoreImpl>(std::move(store), options.host, port, options.is_server));
    } catch (...) {
      error = ExceptionMessage(std::current_exception());
    }
    // A server that cannot listen (port in use, no permission) will not
    // get better by retrying; a client retries until the server is up.
    if (options.is_server) {
      return absl::UnavailableError(
          absl::StrCat("TcpStore ", where, ": cannot start the server: ", error));
    }
    const absl::Duration remaining = deadline - absl::Now();
    if (remaining <= absl::ZeroDuration()) {
      return absl::UnavailableError(absl::StrCat("TcpStore ", where, ": cannot connect within ",
                                                 absl::FormatDuration(options.connect_timeout),
                                                 " (", attempt, " attempts): ", error));
    }
    absl::SleepFor(std::min(backoff, remaining));
    backoff = std::min(backoff * 2, kMaxConnectBackoff);
  }
}

absl::StatusOr<std::unique_ptr<TcpStore>> OpenTcpStore(const std::string& uri) {
  absl::StatusOr<TcpStoreOptions> options = ParseTcpStoreUri(uri);
  if (!options.ok()) return options.status();
  if (!IsLoopbackHost(options->host) && !options->insecure) {
    // Refused before connecting (omni::OpenStore would refuse it after).
    absl::StatusOr<std::optional<std::string>> secret = omni::LoadJobSecret(options->secret_file);
    if (!secret.ok()) return secret.status();
    if (!secret->has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "store URI '", absl::CHexEscape(uri), "' names host '", options->host,
          "', which other hosts share, and the job has no secret to authenticate its records: "
          "set OMNI_JOB_SECRET (or OMNI_JOB_SECRET_FILE, or ?secret_file=PATH) to the job's "
          "secret, the same for every replica, or add insecure=1 to accept forged records "
          "(docs/elastic.md, \"Threat model\")"));
    }
  }
  return TcpStore::Open(*options);
}

absl::Status RegisterTcpStore() {
  const omni::StoreFactory factory =
      [](const std::string& uri) -> absl::StatusOr<std::unique_ptr<omni::Store>> {
    absl::StatusOr<std::unique_ptr<TcpStore>> store = OpenTcpStore(uri);
    if (!store.ok()) return store.status();
    return std::unique_ptr<omni::Store>(std::move(*store));
  };
  for (const char* scheme : {"tcp", "env"}) {
    if (absl::Status st = omni::RegisterStoreScheme(scheme, factory); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace omni::torch_ext
