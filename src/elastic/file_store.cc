// Store: the polling defaults, the prefix view, OpenStore and the FileStore.
//
// FileStore layout in its directory:
//
//   <dir>/.lock          flock'ed around every write (Set, Add, CompareAndSet,
//                        Delete), so read-modify-write is atomic across
//                        processes; the kernel drops it when a holder dies.
//   <dir>/k-<encoded>    one file per key, its contents the value. The key is
//                        encoded with '/' -> '%' and '.' -> '+' (neither is a
//                        key character, so the encoding is injective): a name
//                        never contains '/' or '.', so it is never ".", "..",
//                        a path, the lock file or a temporary of
//                        WriteFileAtomic (which ends in ".tmp.<pid>").
//
// Every value is replaced atomically (temporary, rename; not fsynced), so a reader
// needs no lock: it sees either the old or the new file.
//
// Besides the flock, writers of one process serialise on a process-wide
// mutex: on NFS, Linux emulates flock with POSIX record locks, which are
// owned by the process and so do not exclude threads of one process (and
// WriteFileAtomic's temporary name is per process).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/const_init.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fs.h"
#include "omni/auth_store.h"
#include "omni/config.h"
#include "omni/store.h"
#include "store/etcd_store.h"

namespace omni {
namespace {

using internal::ErrnoStatus;

constexpr size_t kMaxKeyLength = 200;
constexpr absl::Duration kMinBackoff = absl::Microseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(2);
// How long a writer waits for the directory lock. Holders only do a few
// small file operations, and a dead holder's lock is dropped by the kernel,
// so this only trips on a hung file system.
constexpr absl::Duration kLockTimeout = absl::Seconds(60);

bool IsKeyChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-' || c == '/';
}

absl::Status ValidateKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("store key must not be empty");
  if (key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store key '", absl::CHexEscape(key), "' is longer than ", kMaxKeyLength, " characters"));
  }
  for (const char c : key) {
    if (!IsKeyChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat("store key '", absl::CHexEscape(key),
                                                     "' has a character outside [A-Za-z0-9_.-/]"));
    }
  }
  return absl::OkStatus();
}

// Calls `ready` with a backoff of kMinBackoff doubling up to kMaxBackoff
// until it returns true (-> true), an error (-> the error) or `timeout` has
// passed (-> false). `ready` is called at least once.
absl::StatusOr<bool> PollUntil(absl::Duration timeout,
                               const std::function<absl::StatusOr<bool>()>& ready) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = kMinBackoff;
  for (;;) {
    absl::StatusOr<bool> r = ready();
    if (!r.ok() || *r) return r;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(backoff, left));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

absl::StatusOr<std::string> PollGet(Store& store, const std::string& key, absl::Duration timeout,
                                    const std::string& label) {
  std::optional<std::string> value;
  absl::StatusOr<bool> found = PollUntil(timeout, [&]() -> absl::StatusOr<bool> {
    absl::StatusOr<std::optional<std::string>> v = store.TryGet(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return false;
    value = std::move(**v);
    return true;
  });
  if (!found.ok()) return found.status();
  if (!*found) {
    return absl::DeadlineExceededError(absl::StrCat(label, ": key '", key, "' still missing after ",
                                                    absl::FormatDuration(timeout)));
  }
  return std::move(*value);
}

absl::Status PollWait(Store& store, const std::vector<std::string>& keys, absl::Duration timeout,
                      const std::string& label) {
  std::vector<std::string> missing = keys;
  absl::StatusOr<bool> done = PollUntil(timeout, [&]() -> absl::StatusOr<bool> {
    std::vector<std::string> still;
    for (const std::string& key : missing) {
      absl::StatusOr<std::optional<std::string>> v = store.TryGet(key);
      if (!v.ok()) return v.status();
      if (!v->has_value()) still.push_back(key);
    }
    missing = std::move(still);
    return missing.empty();
  });
  if (!done.ok()) return done.status();
  if (!*done) {
    return absl::DeadlineExceededError(
        absl::StrCat(label, ": key(s) '", absl::StrJoin(missing, "', '"), "' still missing after ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- prefix view

class PrefixStore final : public Store {
 public:
  PrefixStore(Store& base, std::string prefix) : base_(base), prefix_(std::move(prefix) + "/") {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.Set(Full(key), value);
  }
  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.TryGet(Full(key));
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.Add(Full(key), delta);
  }
  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.CompareAndSet(Full(key), expected, desired);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.Delete(Full(key));
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.Get(Full(key), timeout);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& key : keys) {
      if (absl::Status st = ValidateKey(key); !st.ok()) return st;
      full.push_back(Full(key));
    }
    return base_.Wait(full, timeout);
  }

 private:
  std::string Full(const std::string& key) const { return prefix_ + key; }

  Store& base_;
  const std::string prefix_;  // ends with '/'
};

// ---------------------------------------------------------------- FileStore

using internal::Fd;

// Writers of this process, around the flock (see the file comment).
ABSL_CONST_INIT absl::Mutex g_writer_mu(absl::kConstInit);

// Holds g_writer_mu and an exclusive flock on a lock file; both are released
// on destruction (closing the fd drops the flock).
class DirLock {
 public:
  // Takes the lock on `path` (created if missing), retrying for at most
  // kLockTimeout.
  static absl::StatusOr<std::unique_ptr<DirLock>> Acquire(const std::string& path) {
    auto lock = std::make_unique<DirLock>(path);
    if (lock->fd_.get() < 0) {
      return ErrnoStatus(lock->open_errno_, absl::StrCat("open lock file ", path));
    }
    absl::StatusOr<bool> locked = PollUntil(kLockTimeout, [&]() -> absl::StatusOr<bool> {
      for (;;) {
        if (::flock(lock->fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK) return false;
        return ErrnoStatus(errno, absl::StrCat("flock ", path));
      }
    });
    if (!locked.ok()) return locked.status();
    if (!*locked) {
      return absl::DeadlineExceededError(absl::StrCat("lock file ", path, " still held after ",
                                                      absl::FormatDuration(kLockTimeout)));
    }
    return lock;
  }

  // Takes g_writer_mu and opens `path`; use Acquire.
  explicit DirLock(const std::string& path)
      : hold_(&g_writer_mu),
        fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)),
        open_errno_(errno) {}

 private:
  absl::MutexLock hold_;  // declared first: released last
  Fd fd_;
  int open_errno_;  // meaningful when fd_ < 0
};

class FileStore final : public Store {
 public:
  explicit FileStore(std::string dir)
      : dir_(std::move(dir)),
        lock_path_(dir_ + "/.lock"),
        label_(absl::StrCat("FileStore ", dir_)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    return Write(key, value);
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return Read(key);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    absl::StatusOr<std::optional<std::string>> current = Read(key);
    if (!current.ok()) return current.status();
    int64_t value = 0;
    if (current->has_value() && !absl::SimpleAtoi(**current, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(label_, ": key '", key, "' holds '",
                                                     absl::CHexEscape(current->value()),
                                                     "', not a counter"));
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(value, delta, &sum)) {
      return absl::OutOfRangeError(
          absl::StrCat(label_, ": key '", key, "': ", value, " + ", delta, " overflows int64"));
    }
    if (absl::Status st = Write(key, absl::StrCat(sum)); !st.ok()) return st;
    return sum;
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    absl::StatusOr<std::optional<std::string>> current = Read(key);
    if (!current.ok()) return current.status();
    const bool matches =
        current->has_value() ? !expected.empty() && **current == expected : expected.empty();
    if (!matches) {
      if (current->has_value()) return std::move(**current);
      return absl::NotFoundError(
          absl::StrCat(label_, ": compare-and-set of missing key '", key, "' expected a value"));
    }
    if (absl::Status st = Write(key, desired); !st.ok()) return st;
    return desired;
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    absl::StatusOr<std::unique_ptr<DirLock>> lock = Lock(key);
    if (!lock.ok()) return lock.status();
    const std::string path = PathOf(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    return Annotate(ErrnoStatus(errno, absl::StrCat("unlink ", path)), key);
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return PollGet(*this, key, timeout, label_);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return PollWait(*this, keys, timeout, label_);
  }

 private:
  std::string PathOf(const std::string& key) const {
    std::string name = "k-" + key;
    std::replace(name.begin(), name.end(), '/', '%');
    std::replace(name.begin(), name.end(), '.', '+');
    return absl::StrCat(dir_, "/", name);
  }

  // `st` with the same code, its message prefixed with the store and key.
  absl::Status Annotate(const absl::Status& st, const std::string& key) const {
    return absl::Status(st.code(), absl::StrCat(label_, ": key '", key, "': ", st.message()));
  }

  absl::StatusOr<std::unique_ptr<DirLock>> Lock(const std::string& key) const {
    absl::StatusOr<std::unique_ptr<DirLock>> lock = DirLock::Acquire(lock_path_);
    if (!lock.ok()) return Annotate(lock.status(), key);
    return lock;
  }

  absl::StatusOr<std::optional<std::string>> Read(const std::string& key) const {
    const std::string path = PathOf(key);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return std::optional<std::string>();
      return Annotate(ErrnoStatus(errno, absl::StrCat("open ", path)), key);
    }
    std::string value;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return Annotate(ErrnoStatus(errno, absl::StrCat("read ", path)), key);
      }
      value.append(buf, static_cast<size_t>(n));
    }
    return std::optional<std::string>(std::move(value));
  }

  // REQUIRES: the directory lock is held. Not fsynced: a store lives as
  // long as its job's processes (a host crash ends them too), and at 10..100
  // writes per second (heartbeats) fsyncs would serialise every writer
  // behind the disk.
  absl::Status Write(const std::string& key, const std::string& value) const {
    absl::Status st = internal::WriteFileAtomic(PathOf(key), value, /*durable=*/false);
    return st.ok() ? st : Annotate(st, key);
  }

  const std::string dir_;
  const std::string lock_path_;
  const std::string label_;  // "FileStore <dir>", the prefix of every error
};

absl::StatusOr<std::unique_ptr<Store>> OpenFileStore(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return ErrnoStatus(ec.value(), absl::StrCat("FileStore ", dir, ": cannot create directory"));
  }
  // Creates the lock file and probes for a writable directory, so that an
  // unusable directory fails here rather than at the first Set.
  {
    Fd fd(::open(absl::StrCat(dir, "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      return ErrnoStatus(errno, absl::StrCat("FileStore ", dir, ": cannot open the lock file"));
    }
  }
  if (absl::Status st = internal::CheckWritableDir(absl::StrCat(dir, "/.lock")); !st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("FileStore ", dir, ": directory is not writable: ", st.message()));
  }
  return std::unique_ptr<Store>(std::make_unique<FileStore>(std::move(dir)));
}

}  // namespace

absl::StatusOr<std::string> Store::Get(const std::string& key, absl::Duration timeout) {
  return PollGet(*this, key, timeout, "store");
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return PollWait(*this, keys, timeout, "store");
}

std::unique_ptr<Store> MakePrefixStore(Store& base, std::string prefix) {
  return std::make_unique<PrefixStore>(base, std::move(prefix));
}

absl::Status ValidateStoreKey(const std::string& key) { return ValidateKey(key); }

namespace {

// The factories of RegisterStoreScheme, by scheme.
struct SchemeRegistry {
  absl::Mutex mu;
  std::map<std::string, StoreFactory> factories ABSL_GUARDED_BY(mu);
};

SchemeRegistry& Schemes() {
  static SchemeRegistry registry;
  return registry;
}

bool IsSchemeName(const std::string& scheme) {
  if (scheme.empty() || scheme[0] < 'a' || scheme[0] > 'z') return false;
  return std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '.' || c == '-';
  });
}

}  // namespace

absl::Status RegisterStoreScheme(const std::string& scheme, StoreFactory factory) {
  if (!IsSchemeName(scheme)) {
    return absl::InvalidArgumentError(absl::StrCat("store scheme '", absl::CHexEscape(scheme),
                                                   "' is not a letter followed by [a-z0-9+.-]"));
  }
  if (scheme == "file") {
    return absl::InvalidArgumentError("store scheme 'file' is built in and cannot be replaced");
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("store scheme '", scheme, "': the factory is empty"));
  }
  SchemeRegistry& registry = Schemes();
  absl::MutexLock lock(&registry.mu);
  registry.factories[scheme] = std::move(factory);
  return absl::OkStatus();
}

namespace {

// The store a URI names, before authentication.
absl::StatusOr<std::unique_ptr<Store>> OpenBackend(const std::string& uri,
                                                   const std::string& scheme,
                                                   const std::string& rest,
                                                   const std::vector<std::string>& options) {
  constexpr char kExpected[] = "expected file:///abs/dir or tcp://host:port";
  if (scheme == "file") {
    if (!options.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store URI '", absl::CHexEscape(uri), "' has an unknown option '",
          absl::CHexEscape(options.front()), "' (file:// knows secret_file, insecure)"));
    }
    if (rest.empty() || rest[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "store URI '", absl::CHexEscape(uri), "' does not name an absolute path; ", kExpected));
    }
    return OpenFileStore(rest);
  }
  if (scheme == "etcd") {
#if OMNI_HAVE_ETCD
    if (!options.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store URI '", absl::CHexEscape(uri), "' has an unknown option '",
          absl::CHexEscape(options.front()), "' (etcd:// knows secret_file, insecure)"));
    }
    return internal::OpenEtcdStore(uri, rest);
#else
    return absl::UnimplementedError(absl::StrCat("store URI '", absl::CHexEscape(uri),
                                                 "': this build has no etcd backend (libcurl)"));
#endif
  }
  StoreFactory factory;
  {
    SchemeRegistry& registry = Schemes();
    absl::MutexLock lock(&registry.mu);
    const auto it = registry.factories.find(scheme);
    if (it != registry.factories.end()) factory = it->second;
  }
  if (factory) return factory(uri);
  if (scheme == "tcp" || scheme == "env") {
    return absl::UnimplementedError(absl::StrCat(
        "store scheme '", scheme, "' (in '", absl::CHexEscape(uri),
        "') is the c10d TCPStore adapter, which needs LibTorch: link omni::torch and call "
        "omni::torch_ext::RegisterTcpStore() before OpenStore (omni/torch/store.h)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported store scheme '",
                                                 absl::CHexEscape(scheme), "' in '",
                                                 absl::CHexEscape(uri), "'; ", kExpected));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& uri) {
  constexpr char kExpected[] = "expected file:///abs/dir or tcp://host:port";
  const std::string::size_type sep = uri.find("://");
  if (sep == std::string::npos || sep == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store URI '", absl::CHexEscape(uri), "' has no scheme; ", kExpected));
  }
  const std::string scheme = uri.substr(0, sep);
  std::string rest = uri.substr(sep + 3);
  // The options OpenStore takes itself; the others go to the backend.
  std::string secret_file;
  bool insecure = false;
  std::vector<std::string> options;
  if (const auto q = rest.find('?'); q != std::string::npos) {
    for (const absl::string_view item :
         absl::StrSplit(rest.substr(q + 1), '&', absl::SkipEmpty())) {
      if (absl::StartsWith(item, "secret_file=")) {
        secret_file = std::string(item.substr(12));
        if (secret_file.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("store URI '", absl::CHexEscape(uri), "' has an empty secret_file="));
        }
      } else if (item == "insecure=1" || item == "insecure=true") {
        insecure = true;
      } else {
        options.emplace_back(item);
      }
    }
    rest.resize(q);
  }
  absl::StatusOr<std::optional<std::string>> secret = LoadJobSecret(secret_file);
  if (!secret.ok()) return secret.status();
  absl::StatusOr<std::unique_ptr<Store>> base = OpenBackend(uri, scheme, rest, options);
  if (!base.ok()) return base.status();
  if (secret->has_value()) return MakeAuthenticatedStore(*std::move(base), **secret);

  const Store::Exposure exposure = (*base)->exposure();
  constexpr char kHowToAuthenticate[] =
      "set OMNI_JOB_SECRET (or OMNI_JOB_SECRET_FILE, or ?secret_file=PATH in the URI) to the "
      "job's secret, the same for every replica (docs/elastic.md, \"Threat model\")";
  if (!exposure.remote.empty() && !insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store '", absl::CHexEscape(uri), "' ", exposure.remote,
        ": other hosts can reach it, and the job has no secret to authenticate its records; ",
        kHowToAuthenticate, ", or add insecure=1 to the URI to accept forged records"));
  }
  if (!exposure.wildcard.empty() && !insecure) {
    std::fprintf(stderr,
                 "omni: warning: store '%s' %s without a job secret: anyone who can reach it "
                 "can read and forge the job's records; %s\n",
                 absl::CHexEscape(uri).c_str(), exposure.wildcard.c_str(), kHowToAuthenticate);
  }
  return base;
}

}  // namespace omni
