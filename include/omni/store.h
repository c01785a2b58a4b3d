// Rendezvous store: a small key/value service that the processes of a job
// share to find each other (membership, generations, communicator setup).
//
//   auto store = omni::OpenStore("file:///shared/job-42/store");
//   (*store)->Set("rank/0/addr", "10.0.0.1:29500");
//   auto n = (*store)->Add("joined", 1);                       // atomic counter
//   auto peer = (*store)->Get("rank/1/addr", absl::Seconds(30));  // waits, bounded
//
// Keys are 1..200 characters of [A-Za-z0-9_.-/]; any other key is rejected
// with InvalidArgument naming it. Values are arbitrary bytes. A counter made
// by Add is stored as its decimal text (Get returns e.g. "3").
//
// Backends: "file:///abs/dir" is a FileStore, one file per key in a directory
// on a local or shared file system (atomic replace for every write; the
// writes of one key (Add, CompareAndSet, Set, Delete) serialised by a per-key
// flock, so a writer frozen mid-write holds up only that key), which
// works between threads and between processes on one host or over a shared
// file system. "tcp://host:port" and "env://" are the c10d TCPStore adapter
// for multi-host jobs (torchrun's MASTER_ADDR / MASTER_PORT); it needs
// LibTorch, so it lives in omni::torch and plugs in through the scheme
// registry below: link omni::torch and call
// omni::torch_ext::RegisterTcpStore() once (see omni/torch/store.h).
//
// Blocking calls (Get, Wait) always take a timeout: there is no unbounded
// wait. They return DeadlineExceeded naming the missing key(s).
//
// Thread safety: every method of every Store may be called from any thread
// concurrently, and (for a FileStore) from any number of processes sharing
// the directory. A prefix view adds no state of its own; it is as
// thread-safe as its base, which must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/export.h"

namespace omni {

class OMNI_EXPORT Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing any earlier value. On success the
  // new value is visible to every later TryGet/Get of any process.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, or nullopt when it does not exist. Never blocks on
  // other callers (beyond the I/O itself).
  virtual absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) = 0;

  // Atomically adds `delta` to the counter `key` (a missing key counts as 0)
  // and returns the new value. InvalidArgument naming the key when its value
  // is not a decimal int64; OutOfRange when the sum would overflow.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // Atomically: when the current value of `key` equals `expected` — or, for
  // an empty `expected`, when `key` does not exist — stores `desired`.
  // Returns the value stored under `key` after the call (`desired` when it
  // was swapped, the current value otherwise). An empty `expected` never
  // matches an existing key, even one holding "". NotFound naming the key
  // when `key` does not exist and `expected` is not empty (nothing stored).
  virtual absl::StatusOr<std::string> CompareAndSet(const std::string& key,
                                                    const std::string& expected,
                                                    const std::string& desired) = 0;

  // Removes `key`; true when it existed.
  virtual absl::StatusOr<bool> Delete(const std::string& key) = 0;

  // The value of `key`, waiting until it exists for at most `timeout`
  // (a timeout <= 0 checks once). DeadlineExceeded naming the key and the
  // timeout when it still does not exist. The default polls TryGet with a
  // backoff of 0.1 ms doubling up to 2 ms.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout);

  // OK once every key of `keys` exists, waiting for at most `timeout`.
  // DeadlineExceeded naming the keys still missing. The default polls TryGet
  // (0.1 ms .. 2 ms backoff).
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout);

  // Optional (a capability): a key that lives only while its writer does.
  // Stores `value` under `key` attached to a lease of `ttl` and renews that
  // lease; when no call for `key` renews it for `ttl` (its writer died or
  // froze), the store deletes the key by itself. The lease belongs to this
  // Store object; call it again within `ttl` to keep the key. A backend may
  // round `ttl` up (etcd: whole seconds, at least its minimum of about 2 s).
  // The default, for stores whose has_leases() is false, is Set: the key
  // stays until deleted. Errors as Set's.
  virtual absl::Status SetWithLease(const std::string& key, const std::string& value,
                                    absl::Duration ttl);
  // True when SetWithLease's keys expire by themselves (etcd://).
  virtual bool has_leases() const { return false; }

  // Who besides this host can reach the store's records (a capability
  // query; the default: nobody). OpenStore uses it to refuse a store that
  // other hosts reach when the job has no secret.
  struct Exposure {
    // Non-empty when this process connects to the store over the network,
    // e.g. "connects to 10.0.0.1:29500".
    std::string remote;
    // Non-empty when this process serves the store on more addresses than
    // its URI names, e.g. "serves port 29500 on every interface".
    std::string wildcard;
  };
  virtual Exposure exposure() const { return {}; }
};

// A view of `base` in which every key `k` is stored as `prefix` + "/" + `k`,
// so stores with different prefixes never see each other's keys (e.g. one
// prefix per membership generation). Does not own `base`, which must outlive
// the view. A prefix that is not a valid key makes every call fail with
// InvalidArgument naming the full key.
OMNI_EXPORT std::unique_ptr<Store> MakePrefixStore(Store& base, std::string prefix);

// OK when `key` is a valid store key (see the top of this file), otherwise
// InvalidArgument naming it. Every backend checks keys with it, so all stores
// accept and reject the same keys.
OMNI_EXPORT absl::Status ValidateStoreKey(const std::string& key);

// Opens a store by URI:
//   file:///abs/dir[?durable=1]
//                     a FileStore in `dir` (created if missing);
//                     PermissionDenied (or the OS error) naming the
//                     directory when it cannot be created or written.
//                     Every write replaces the key's file atomically, so
//                     after any failure or crash a key holds its previous
//                     value or its new one, never a mix. Without durable=1
//                     writes are not fsynced: a crash of the whole host may
//                     lose the last writes (the job's processes die with it);
//                     with durable=1 each write is fsynced (file, then
//                     directory) before it returns. Values are at most
//                     64 MiB (InvalidArgument naming the key).
//   <scheme>://...    the factory registered for `scheme` (below), called
//                     with the whole URI; its error as it returns it. A
//                     factory must accept the options `secret_file` and
//                     `insecure` (below), and may apply them before it
//                     connects (the tcp:// adapter refuses a remote host
//                     without a secret there).
//   etcd://host:port[,host:port...]
//                     an etcd cluster through its v3 JSON gateway (plain
//                     HTTP, libcurl; every endpoint a member's client URL;
//                     a request goes to the next endpoint when one does not
//                     answer). Unimplemented in a build without libcurl
//                     (omni/config.h: OMNI_HAVE_ETCD).
//   tcp://, env://    while nothing is registered for them: Unimplemented
//                     saying to link omni::torch and call
//                     omni::torch_ext::RegisterTcpStore().
// InvalidArgument naming the URI for anything else, including a relative
// or empty file path.
//
// Authentication (omni/auth_store.h): when the job has a secret — the file
// named by the URI option `secret_file=PATH`, else the file named by
// OMNI_JOB_SECRET_FILE, else OMNI_JOB_SECRET, read at this call — the store
// returned is the authenticated view of the backend: every record is
// MAC'd, and forged ones are refused (PermissionDenied naming the key).
// Without a secret, a store whose exposure() says other hosts reach it is
// refused (FailedPrecondition saying how to give a secret) unless the URI
// has `insecure=1`; one that serves on more addresses than it names is
// opened with a warning on stderr. A bad secret (missing or unreadable file,
// shorter than kMinJobSecretBytes) is InvalidArgument naming its source.
// Options are the URI's query (`?a=1&b=2`). A file:// URI takes no other
// option than durable (InvalidArgument naming it), so its path cannot
// contain '?'.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& uri);

// Makes OpenStore hand URIs "<scheme>://..." to `factory` (called with the
// whole URI, on the thread calling OpenStore, without any lock held).
// Registering a scheme again replaces its factory. InvalidArgument for
// "file" (built in), a null factory, or a scheme that is not a lowercase
// letter followed by [a-z0-9+.-]. Thread-safe; usually called once at
// start-up, e.g. by omni::torch_ext::RegisterTcpStore() for tcp and env.
using StoreFactory = std::function<absl::StatusOr<std::unique_ptr<Store>>(const std::string& uri)>;
OMNI_EXPORT absl::Status RegisterStoreScheme(const std::string& scheme, StoreFactory factory);

}  // namespace omni
