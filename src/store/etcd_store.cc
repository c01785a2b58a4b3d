// EtcdStore: omni::Store over etcd's v3 JSON gateway (POST /v3/kv/...,
// keys and values base64), with libcurl. Private; opened by OpenStore for
// "etcd://host:port[,host:port...]" (etcd_store.h).
//
// Mapping:
//   Set            kv/put
//   TryGet         kv/range of the key
//   Delete         kv/deleterange ("deleted" > 0)
//   CompareAndSet  one kv/txn: compare the value (or create_revision == 0
//                  for an empty `expected`), put on success, range on
//                  failure: atomic in etcd, one round trip.
//   Add            range, then a txn comparing the mod_revision read (or
//                  create_revision == 0): retried while another writer
//                  was first.
//   SetWithLease   lease/keepalive of the key's lease (lease/grant when it
//                  has none or it expired), then kv/put with that lease:
//                  etcd deletes the key when the lease is not renewed for
//                  its TTL (Membership's heartbeats, so a dead member's
//                  heartbeat key vanishes).
// Generation records are proposed with CompareAndSet(key, "", record): a txn
// on create_revision == 0, so of two proposals for one number exactly one is
// stored, by etcd's revision order.
// A request that cannot reach an endpoint (refused, timed out) goes to the
// next one; the endpoint that answered last is tried first next time. etcd
// replicates every write through raft, so any member answers the same.
#include "store/etcd_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
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
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace omni::internal {
namespace {

using Json = nlohmann::json;

// Rounds of Add's read-compare-write before giving up under contention.
constexpr int kMaxAddRounds = 1000;
// Longest response read, in bytes (a store value is small; this bounds a
// misbehaving endpoint).
constexpr size_t kMaxResponseBytes = 64 << 20;

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

size_t Collect(char* data, size_t size, size_t n, void* out) {
  auto* body = static_cast<std::string*>(out);
  if (body->size() + size * n > kMaxResponseBytes) return 0;  // aborts the transfer
  body->append(data, size * n);
  return size * n;
}

bool IsLoopback(const std::string& endpoint) {
  return endpoint.rfind("127.", 0) == 0 || endpoint.rfind("localhost:", 0) == 0 ||
         endpoint.rfind("[::1]:", 0) == 0;
}

struct Kv {
  std::string value;
  std::string mod_revision;
};

class EtcdStore final : public Store {
 public:
  EtcdStore(std::vector<std::string> endpoints, absl::Duration timeout)
      : endpoints_(std::move(endpoints)),
        timeout_(timeout),
        label_(absl::StrCat("EtcdStore ", absl::StrJoin(endpoints_, ","))) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    return Post("kv/put", key, Json{{"key", B64(key)}, {"value", B64(value)}}).status();
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<std::optional<Kv>> kv = Range(key);
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) return std::optional<std::string>();
    return std::optional<std::string>(std::move((*kv)->value));
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    absl::StatusOr<Json> r = Post("kv/deleterange", key, Json{{"key", B64(key)}});
    if (!r.ok()) return r.status();
    int64_t deleted = 0;
    if (r->contains("deleted") && r->at("deleted").is_string()) {
      if (!absl::SimpleAtoi(r->at("deleted").get<std::string>(), &deleted)) deleted = 0;
    }
    return deleted > 0;
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    Json compare = expected.empty() ? Json{{"key", B64(key)},
                                           {"target", "CREATE"},
                                           {"result", "EQUAL"},
                                           {"create_revision", "0"}}
                                    : Json{{"key", B64(key)},
                                           {"target", "VALUE"},
                                           {"result", "EQUAL"},
                                           {"value", B64(expected)}};
    absl::StatusOr<std::pair<bool, std::optional<Kv>>> r = Txn(key, std::move(compare), desired);
    if (!r.ok()) return r.status();
    if (r->first) return desired;
    if (!r->second.has_value()) {
      return absl::NotFoundError(
          absl::StrCat(label_, ": compare-and-set of missing key '", key, "' expected a value"));
    }
    return std::move(r->second->value);
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    for (int round = 0; round < kMaxAddRounds; ++round) {
      absl::StatusOr<std::optional<Kv>> kv = Range(key);
      if (!kv.ok()) return kv.status();
      int64_t value = 0;
      if (kv->has_value() && !absl::SimpleAtoi((*kv)->value, &value)) {
        return absl::InvalidArgumentError(absl::StrCat(label_, ": key '", key, "' holds '",
                                                       absl::CHexEscape((*kv)->value),
                                                       "', not a counter"));
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(value, delta, &sum)) {
        return absl::OutOfRangeError(
            absl::StrCat(label_, ": key '", key, "': ", value, " + ", delta, " overflows int64"));
      }
      Json compare = kv->has_value() ? Json{{"key", B64(key)},
                                            {"target", "MOD"},
                                            {"result", "EQUAL"},
                                            {"mod_revision", (*kv)->mod_revision}}
                                     : Json{{"key", B64(key)},
                                            {"target", "CREATE"},
                                            {"result", "EQUAL"},
                                            {"create_revision", "0"}};
      absl::StatusOr<std::pair<bool, std::optional<Kv>>> r =
          Txn(key, std::move(compare), absl::StrCat(sum));
      if (!r.ok()) return r.status();
      if (r->first) return sum;
    }
    return absl::AbortedError(absl::StrCat(label_, ": key '", key, "': still contended after ",
                                           kMaxAddRounds, " rounds"));
  }

  // One lease per key, granted at the first call and renewed (keepalive) at
  // every later one; the put attaches the key to it. A lease that expired
  // meanwhile (the caller was frozen, or etcd lost it) is replaced by a new
  // one. A lease's TTL is whole seconds, at least etcd's minimum (2 s with
  // its default election timeout): `ttl` is rounded up.
  absl::Status SetWithLease(const std::string& key, const std::string& value,
                            absl::Duration ttl) override ABSL_LOCKS_EXCLUDED(lease_mu_) {
    if (absl::Status st = ValidateStoreKey(key); !st.ok()) return st;
    const int64_t ttl_s =
        std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
    absl::MutexLock lock(&lease_mu_);
    std::string& id = leases_[key];
    if (!id.empty()) {
      absl::StatusOr<Json> r = Post("lease/keepalive", key, Json{{"ID", id}});
      if (!r.ok()) return r.status();
      // A stream's message is wrapped in "result"; an expired lease has no TTL.
      const Json& result = r->contains("result") ? r->at("result") : *r;
      const auto ttl_it = result.is_object() ? result.find("TTL") : result.end();
      const bool alive =
          ttl_it != result.end() && ((ttl_it->is_string() && ttl_it->get<std::string>() != "0") ||
                                     (ttl_it->is_number() && ttl_it->get<double>() > 0));
      if (!alive) id.clear();
    }
    for (int round = 0; round < 2; ++round) {
      if (id.empty()) {
        absl::StatusOr<Json> r = Post("lease/grant", key, Json{{"TTL", ttl_s}});
        if (!r.ok()) return r.status();
        if (!r->contains("ID") || !r->at("ID").is_string()) {
          return absl::DataLossError(
              absl::StrCat(label_, ": lease grant for key '", key, "': no ID in the response"));
        }
        id = r->at("ID").get<std::string>();
      }
      absl::StatusOr<Json> put =
          Post("kv/put", key, Json{{"key", B64(key)}, {"value", B64(value)}, {"lease", id}});
      if (put.ok()) return absl::OkStatus();
      if (!absl::IsNotFound(put.status())) return put.status();
      id.clear();  // expired between the keepalive and the put: a new one
    }
    return absl::AbortedError(
        absl::StrCat(label_, ": key '", key, "': its new lease expired before the put"));
  }

  bool has_leases() const override { return true; }

  Exposure exposure() const override {
    Exposure e;
    if (!std::all_of(endpoints_.begin(), endpoints_.end(), IsLoopback)) {
      e.remote = absl::StrCat("connects to etcd at ", absl::StrJoin(endpoints_, ","));
    }
    return e;
  }

 private:
  // The kv of a range response's first entry (nullopt when none).
  static absl::StatusOr<std::optional<Kv>> FirstKv(const Json& range, const std::string& what) {
    if (!range.contains("kvs")) return std::optional<Kv>();
    const Json& kvs = range.at("kvs");
    if (!kvs.is_array() || kvs.empty() || !kvs[0].is_object()) {
      return absl::DataLossError(absl::StrCat(what, ": malformed kvs in the response"));
    }
    Kv kv;
    std::string b64 = kvs[0].value("value", std::string());
    if (!absl::Base64Unescape(b64, &kv.value)) {
      return absl::DataLossError(absl::StrCat(what, ": value is not base64"));
    }
    kv.mod_revision = kvs[0].value("mod_revision", std::string("0"));
    return std::optional<Kv>(std::move(kv));
  }

  absl::StatusOr<std::optional<Kv>> Range(const std::string& key) {
    absl::StatusOr<Json> r = Post("kv/range", key, Json{{"key", B64(key)}});
    if (!r.ok()) return r.status();
    return FirstKv(*r, absl::StrCat(label_, ": range of key '", key, "'"));
  }

  // One transaction: `compare`, then put `desired` on success or range the
  // key on failure. (succeeded, the key's kv on failure).
  absl::StatusOr<std::pair<bool, std::optional<Kv>>> Txn(const std::string& key, Json compare,
                                                         const std::string& desired) {
    Json txn{
        {"compare", Json::array({std::move(compare)})},
        {"success",
         Json::array({Json{{"request_put", Json{{"key", B64(key)}, {"value", B64(desired)}}}}})},
        {"failure", Json::array({Json{{"request_range", Json{{"key", B64(key)}}}}})}};
    absl::StatusOr<Json> r = Post("kv/txn", key, txn);
    if (!r.ok()) return r.status();
    const bool succeeded = r->value("succeeded", false);
    if (succeeded) return std::make_pair(true, std::optional<Kv>());
    const std::string what = absl::StrCat(label_, ": transaction on key '", key, "'");
    if (!r->contains("responses") || !r->at("responses").is_array() || r->at("responses").empty() ||
        !r->at("responses")[0].contains("response_range")) {
      return absl::DataLossError(absl::StrCat(what, ": no range in the failure response"));
    }
    absl::StatusOr<std::optional<Kv>> kv = FirstKv(r->at("responses")[0]["response_range"], what);
    if (!kv.ok()) return kv.status();
    return std::make_pair(false, *std::move(kv));
  }

  // POSTs `body` to /v3/<op> of the first endpoint that answers. An endpoint
  // that cannot be reached, or answers 5xx (e.g. 503 from a member without
  // a quorum), or not JSON, passes the request to the next one; a 4xx with
  // etcd's JSON error is the request's own error (NotFound for gRPC code 5,
  // e.g. an expired lease; FailedPrecondition otherwise), naming the key.
  absl::StatusOr<Json> Post(const std::string& op, const std::string& key, const Json& body)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const std::string payload = body.dump();
    absl::MutexLock lock(&mu_);
    if (curl_ == nullptr) {
      curl_.reset(curl_easy_init());
      if (curl_ == nullptr) return absl::InternalError(absl::StrCat(label_, ": curl_easy_init"));
    }
    std::vector<std::string> errors;
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      const size_t e = (preferred_ + i) % endpoints_.size();
      const std::string url = absl::StrCat("http://", endpoints_[e], "/v3/", op);
      std::string response;
      CURL* c = curl_.get();
      curl_easy_reset(c);
      curl_easy_setopt(c, CURLOPT_URL, url.c_str());
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload.c_str());
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(payload.size()));
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Collect);
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
      curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
      const CURLcode rc = curl_easy_perform(c);
      if (rc != CURLE_OK) {
        errors.push_back(absl::StrCat(endpoints_[e], ": ", curl_easy_strerror(rc)));
        continue;
      }
      long http = 0;
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
      Json j = Json::parse(response, nullptr, /*allow_exceptions=*/false);
      if (http >= 400 && http < 500 && j.is_object() && j.contains("error")) {
        preferred_ = e;
        const Json& error = j.contains("message") ? j["message"] : j["error"];
        const std::string message = error.is_string() ? error.get<std::string>() : error.dump();
        const std::string what = absl::StrCat(label_, ": ", op, " of key '", key, "': ", message);
        const bool not_found = j.contains("code") && j["code"].is_number() && j["code"] == 5;
        return not_found ? absl::NotFoundError(what) : absl::FailedPreconditionError(what);
      }
      if (http != 200 || j.is_discarded() || !j.is_object()) {
        // A member without a quorum answers 503: another may have one.
        errors.push_back(absl::StrCat(endpoints_[e], ": HTTP ", http, ": ",
                                      absl::CHexEscape(response.substr(0, 200))));
        continue;
      }
      preferred_ = e;
      return j;
    }
    return absl::UnavailableError(
        absl::StrCat(label_, ": ", op, " of key '", key,
                     "': no endpoint answered: ", absl::StrJoin(errors, "; ")));
  }

  struct CurlFree {
    void operator()(CURL* c) const { curl_easy_cleanup(c); }
  };

  const std::vector<std::string> endpoints_;
  const absl::Duration timeout_;
  const std::string label_;
  absl::Mutex mu_;
  std::unique_ptr<CURL, CurlFree> curl_ ABSL_GUARDED_BY(mu_);
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
  // Held across SetWithLease (before mu_): the lease ID of each leased key.
  absl::Mutex lease_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::string, std::string> leases_ ABSL_GUARDED_BY(lease_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenEtcdStore(const std::string& uri,
                                                     const std::string& endpoints) {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);  // once, thread-safe
  if (init != CURLE_OK) return absl::InternalError("libcurl: curl_global_init failed");
  std::vector<std::string> list = absl::StrSplit(endpoints, ',', absl::SkipEmpty());
  if (list.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("store URI '", absl::CHexEscape(uri),
                     "' names no endpoint; expected etcd://host:port[,host:port...]"));
  }
  for (const std::string& e : list) {
    const auto colon = e.rfind(':');
    uint32_t port = 0;
    if (colon == std::string::npos || colon == 0 || e.find('/') != std::string::npos ||
        !absl::SimpleAtoi(e.substr(colon + 1), &port) || port == 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("store URI '", absl::CHexEscape(uri), "': endpoint '", absl::CHexEscape(e),
                       "' is not host:port; expected etcd://host:port[,host:port...]"));
    }
  }
  return std::unique_ptr<Store>(std::make_unique<EtcdStore>(std::move(list), absl::Seconds(5)));
}

}  // namespace omni::internal
