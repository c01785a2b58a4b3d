// Store: the polling defaults, key validation, the prefix view, the scheme
// registry and OpenStore (omni/store.h). The backends are beside it:
// file_store.cc, etcd_store.cc, auth_store.cc (the authenticated view) and,
// in omni::torch, src/torch/tcp_store.cc.
#include "omni/store.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "omni/auth_store.h"
#include "omni/config.h"
#include "store/etcd_store.h"
#include "store/file_store.h"
#include "store/poll.h"

namespace omni {
namespace {

constexpr size_t kMaxKeyLength = 200;

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
  absl::Status SetWithLease(const std::string& key, const std::string& value,
                            absl::Duration ttl) override {
    if (absl::Status st = ValidateKey(key); !st.ok()) return st;
    return base_.SetWithLease(Full(key), value, ttl);
  }
  bool has_leases() const override { return base_.has_leases(); }
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

}  // namespace

absl::StatusOr<std::string> Store::Get(const std::string& key, absl::Duration timeout) {
  return internal::PollGet(*this, key, timeout, "store");
}

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return internal::PollWait(*this, keys, timeout, "store");
}

absl::Status Store::SetWithLease(const std::string& key, const std::string& value,
                                 absl::Duration /*ttl*/) {
  return Set(key, value);
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
    bool durable = false;
    for (const std::string& option : options) {
      if (option == "durable=1" || option == "durable=true") {
        durable = true;
      } else if (option != "durable=0" && option != "durable=false") {
        return absl::InvalidArgumentError(absl::StrCat(
            "store URI '", absl::CHexEscape(uri), "' has an unknown option '",
            absl::CHexEscape(option), "' (file:// knows durable, secret_file, insecure)"));
      }
    }
    if (rest.empty() || rest[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "store URI '", absl::CHexEscape(uri), "' does not name an absolute path; ", kExpected));
    }
    return internal::OpenFileStore(rest, durable);
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
