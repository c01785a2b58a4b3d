// The authenticated store view and the job secret (omni/auth_store.h).
#include "omni/auth_store.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fs.h"

namespace omni {
namespace {

constexpr char kMagic[] = "OMNIMAC1";
constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr size_t kNonceBytes = 16;
constexpr size_t kTagBytes = crypto_auth_hmacsha512256_BYTES;
constexpr size_t kHeaderBytes = kMagicBytes + kNonceBytes + kTagBytes;
// Domain separation: these MACs are store records of this format, nothing else.
constexpr char kDomain[] = "omni.store.record.v1";
constexpr char kKdfKey[] = "omni.job.secret.to.mac.key.v1";
// Compare-and-set rounds before giving up under contention.
constexpr int kMaxRounds = 1000;
// Keys whose refusal is logged, at most (then one line says the log is full).
constexpr size_t kMaxLoggedKeys = 1000;

absl::Status InitSodium() {
  static const int rc = sodium_init();  // thread-safe, idempotent
  if (rc < 0) return absl::InternalError("libsodium: sodium_init failed");
  return absl::OkStatus();
}

class AuthStore final : public Store {
 public:
  AuthStore(Store& base, std::unique_ptr<Store> owned, std::string_view secret)
      : owned_(std::move(owned)), base_(base) {
    crypto_generichash(key_, sizeof(key_), reinterpret_cast<const unsigned char*>(secret.data()),
                       secret.size(), reinterpret_cast<const unsigned char*>(kKdfKey),
                       sizeof(kKdfKey) - 1);
  }
  ~AuthStore() override { sodium_memzero(key_, sizeof(key_)); }
  AuthStore(const AuthStore&) = delete;
  AuthStore& operator=(const AuthStore&) = delete;

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    return base_.Set(key, Seal(key, value));
  }

  absl::Status SetWithLease(const std::string& key, const std::string& value,
                            absl::Duration ttl) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    return base_.SetWithLease(key, Seal(key, value), ttl);
  }

  bool has_leases() const override { return base_.has_leases(); }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    absl::StatusOr<std::optional<std::string>> raw = base_.TryGet(key);
    if (!raw.ok() || !raw->has_value()) return raw;
    absl::StatusOr<std::string> value = Open(key, **raw);
    if (!value.ok()) return value.status();
    return std::optional<std::string>(*std::move(value));
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::StatusOr<std::string> raw = base_.Get(key, timeout);
    if (!raw.ok()) return raw;
    return Open(key, *raw);
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return base_.Wait(keys, timeout);
  }

  absl::StatusOr<bool> Delete(const std::string& key) override { return base_.Delete(key); }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    for (int round = 0; round < kMaxRounds; ++round) {
      absl::StatusOr<std::optional<std::string>> raw = base_.TryGet(key);
      if (!raw.ok()) return raw.status();
      int64_t value = 0;
      if (raw->has_value()) {
        absl::StatusOr<std::string> text = Open(key, **raw);
        if (!text.ok()) return text.status();
        if (!absl::SimpleAtoi(*text, &value)) {
          return absl::InvalidArgumentError(
              absl::StrCat("store key '", key, "' holds '", *text, "', not a counter"));
        }
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(value, delta, &sum)) {
        return absl::OutOfRangeError(
            absl::StrCat("store key '", key, "': ", value, " + ", delta, " overflows int64"));
      }
      const std::string sealed = Seal(key, absl::StrCat(sum));
      absl::StatusOr<std::string> now =
          base_.CompareAndSet(key, raw->has_value() ? **raw : std::string(), sealed);
      if (now.ok() && *now == sealed) return sum;
      if (!now.ok() && !absl::IsNotFound(now.status())) return now.status();
      // Another writer was first (or deleted the key): read again.
    }
    return Contention(key);
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    for (int round = 0; round < kMaxRounds; ++round) {
      absl::StatusOr<std::optional<std::string>> raw = base_.TryGet(key);
      if (!raw.ok()) return raw.status();
      std::optional<std::string> current;  // the authentic value, if any
      if (raw->has_value()) {
        absl::StatusOr<std::string> value = Open(key, **raw);
        if (value.ok()) current = *std::move(value);
      }
      if (current.has_value()) {
        if (expected.empty() || *current != expected) return *current;
      } else if (!expected.empty()) {
        return absl::NotFoundError(
            absl::StrCat("compare-and-set of missing key '", key, "' expected a value",
                         raw->has_value() ? " (the record there is not authentic)" : ""));
      }
      const std::string sealed = Seal(key, desired);
      // Replace the authentic value we compared, the forgery we refused, or
      // create the key.
      std::string base_expected = raw->has_value() ? **raw : std::string();
      if (raw->has_value() && base_expected.empty()) {
        // A forged "" cannot be compared against (an empty `expected` means
        // absent): remove it, then create.
        absl::StatusOr<bool> gone = base_.Delete(key);
        if (!gone.ok()) return gone.status();
      }
      absl::StatusOr<std::string> now = base_.CompareAndSet(key, base_expected, sealed);
      if (now.ok() && *now == sealed) return desired;
      if (!now.ok() && !absl::IsNotFound(now.status())) return now.status();
    }
    return Contention(key);
  }

 private:
  static absl::Status Contention(const std::string& key) {
    return absl::AbortedError(absl::StrCat("store key '", key, "': still contended after ",
                                           kMaxRounds, " compare-and-set rounds"));
  }

  void Mac(const std::string& key, std::string_view nonce, std::string_view value,
           unsigned char* tag) const {
    crypto_auth_hmacsha512256_state st;
    crypto_auth_hmacsha512256_init(&st, key_, sizeof(key_));
    const auto update = [&](std::string_view bytes) {
      crypto_auth_hmacsha512256_update(&st, reinterpret_cast<const unsigned char*>(bytes.data()),
                                       bytes.size());
    };
    update(std::string_view(kDomain, sizeof(kDomain)));  // with its NUL
    unsigned char len[8];
    uint64_t n = key.size();
    for (unsigned char& b : len) {
      b = static_cast<unsigned char>(n & 0xff);
      n >>= 8;
    }
    update(std::string_view(reinterpret_cast<const char*>(len), sizeof(len)));
    update(key);
    update(nonce);
    update(value);
    crypto_auth_hmacsha512256_final(&st, tag);
  }

  std::string Seal(const std::string& key, const std::string& value) const {
    std::string out(kHeaderBytes + value.size(), '\0');
    std::memcpy(out.data(), kMagic, kMagicBytes);
    auto* nonce = reinterpret_cast<unsigned char*>(out.data() + kMagicBytes);
    randombytes_buf(nonce, kNonceBytes);
    std::memcpy(out.data() + kHeaderBytes, value.data(), value.size());
    Mac(key, std::string_view(out.data() + kMagicBytes, kNonceBytes), value,
        reinterpret_cast<unsigned char*>(out.data() + kMagicBytes + kNonceBytes));
    return out;
  }

  absl::StatusOr<std::string> Open(const std::string& key, const std::string& raw) {
    if (raw.size() < kHeaderBytes || raw.compare(0, kMagicBytes, kMagic) != 0) {
      return Refuse(key, "has no MAC (written without the job secret)");
    }
    const std::string_view nonce(raw.data() + kMagicBytes, kNonceBytes);
    const std::string_view value(raw.data() + kHeaderBytes, raw.size() - kHeaderBytes);
    unsigned char tag[kTagBytes];
    Mac(key, nonce, value, tag);
    if (sodium_memcmp(tag, raw.data() + kMagicBytes + kNonceBytes, kTagBytes) != 0) {
      return Refuse(key,
                    "fails its MAC (forged, damaged, moved from another key, or sealed with "
                    "another job's secret)");
    }
    return std::string(value);
  }

  absl::Status Refuse(const std::string& key, const std::string& why) ABSL_LOCKS_EXCLUDED(mu_) {
    std::string message = absl::StrCat("store key '", key, "': the record ", why, "; refused");
    bool log = false;
    bool full = false;
    {
      absl::MutexLock lock(&mu_);
      if (logged_.size() < kMaxLoggedKeys) {
        log = logged_.insert(key).second;
      } else if (!log_full_) {
        full = log_full_ = true;
      }
    }
    if (log) std::fprintf(stderr, "omni: authenticated store: %s\n", message.c_str());
    if (full) {
      std::fprintf(stderr, "omni: authenticated store: %zu keys refused; no more are logged\n",
                   kMaxLoggedKeys);
    }
    return absl::PermissionDeniedError(message);
  }

  std::unique_ptr<Store> owned_;  // null for a non-owning view
  Store& base_;
  unsigned char key_[crypto_auth_hmacsha512256_KEYBYTES];
  absl::Mutex mu_;
  std::set<std::string> logged_ ABSL_GUARDED_BY(mu_);
  bool log_full_ ABSL_GUARDED_BY(mu_) = false;
};

absl::Status CheckSecret(std::string_view secret, const std::string& source) {
  if (secret.size() < kMinJobSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job secret from ", source, " is too short: ", secret.size(),
                     " bytes, at least ", kMinJobSecretBytes, " needed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& source) {
  const std::string what = absl::StrCat("job secret file '", path, "' (", source, ")");
  internal::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a regular file"));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxJobSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", st.st_size, " bytes, more than ", kMaxJobSecretBytes));
  }
  std::string secret(kMaxJobSecretBytes + 1, '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = ::read(fd.get(), secret.data() + got, secret.size() - got);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InvalidArgumentError(absl::StrCat(what, ": read: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(n);
  }
  if (got > kMaxJobSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": more than ", kMaxJobSecretBytes, " bytes"));
  }
  secret.resize(got);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (absl::Status s = CheckSecret(secret, what); !s.ok()) return s;
  return secret;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> LoadJobSecret(const std::string& secret_file) {
  if (!secret_file.empty()) {
    absl::StatusOr<std::string> s = ReadSecretFile(secret_file, "secret_file= in the store URI");
    if (!s.ok()) return s.status();
    return std::optional<std::string>(*std::move(s));
  }
  if (const char* path = std::getenv("OMNI_JOB_SECRET_FILE"); path != nullptr && *path != '\0') {
    absl::StatusOr<std::string> s = ReadSecretFile(path, "OMNI_JOB_SECRET_FILE");
    if (!s.ok()) return s.status();
    return std::optional<std::string>(*std::move(s));
  }
  if (const char* value = std::getenv("OMNI_JOB_SECRET"); value != nullptr && *value != '\0') {
    if (absl::Status s = CheckSecret(value, "OMNI_JOB_SECRET"); !s.ok()) return s;
    return std::optional<std::string>(value);
  }
  return std::optional<std::string>();
}

absl::StatusOr<std::unique_ptr<Store>> MakeAuthenticatedStore(Store& base,
                                                              std::string_view secret) {
  if (absl::Status st = InitSodium(); !st.ok()) return st;
  if (absl::Status st = CheckSecret(secret, "the caller"); !st.ok()) return st;
  return std::unique_ptr<Store>(std::make_unique<AuthStore>(base, nullptr, secret));
}

absl::StatusOr<std::unique_ptr<Store>> MakeAuthenticatedStore(std::unique_ptr<Store> base,
                                                              std::string_view secret) {
  if (base == nullptr) return absl::InvalidArgumentError("MakeAuthenticatedStore: null store");
  if (absl::Status st = InitSodium(); !st.ok()) return st;
  if (absl::Status st = CheckSecret(secret, "the caller"); !st.ok()) return st;
  Store& ref = *base;
  return std::unique_ptr<Store>(std::make_unique<AuthStore>(ref, std::move(base), secret));
}

}  // namespace omni
