// An authenticated view of a Store: every record carries a MAC made with the
// job's secret, so that a process that can reach the store but does not hold
// the secret (anyone on the network for a tcp:// store, any user who can
// write a shared directory) cannot forge what the job acts upon: preemption
// notices, generation records, join tickets, heartbeats, communicator
// addresses.
//
//   auto secret = omni::LoadJobSecret("");          // OMNI_JOB_SECRET(_FILE)
//   auto store = omni::MakeAuthenticatedStore(std::move(raw), **secret);
//
// OpenStore applies it by itself when the job has a secret (see store.h), so
// callers rarely build one.
//
// Record format (what the base store holds under the same key):
//   "OMNIMAC1" | nonce (16 bytes) | tag (32 bytes) | value
// tag = HMAC-SHA-512-256 (libsodium crypto_auth) under a key derived from
// the secret (BLAKE2b), over a domain tag, the key, the nonce and the value.
// So a record is bound to its key (a record copied to another key is
// refused), and every write is distinct (the nonce), which makes the
// compare-and-set loops below exact.
//
// Semantics are Store's (store.h), with these differences:
//   - A record that fails its MAC (forged, damaged, or written without the
//     secret) is refused: TryGet and Get return PermissionDenied naming the
//     key, and the refusal is logged on stderr (once per key). The caller
//     goes on as if the record were not there.
//   - CompareAndSet with an empty `expected` treats a forged record as
//     absent and replaces it, so that a forgery cannot block the job's own
//     record (e.g. a generation); with a non-empty `expected` a forged
//     record is NotFound.
//   - Add is a compare-and-set loop over an authenticated decimal value (a
//     raw add by a forger fails: the value is not plain text). A forged
//     counter is PermissionDenied (the job cannot tell what it was).
//   - Wait and Delete are not authenticated: a forger can delete records or
//     create keys that make a Wait return (a Get of them is then refused).
// What it does not protect (docs/elastic.md, "Threat model"): the
// confidentiality of values (they travel in clear), a replay of an earlier
// authentic record of the same key, denial of service (deleting or
// overwriting records), and a member that holds the secret.
//
// Thread safety: as the base store; the refusal log takes its own lock.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/store.h"

namespace omni {

// Shortest secret accepted, in bytes.
inline constexpr size_t kMinJobSecretBytes = 16;
// Longest secret file read, in bytes.
inline constexpr size_t kMaxJobSecretBytes = 4096;

// The job secret, from the first of:
//   `secret_file` (when not empty), the file named by OMNI_JOB_SECRET_FILE,
//   the value of OMNI_JOB_SECRET;
// nullopt when none is set. A file's trailing newlines are dropped; it must
// be a regular file of at most kMaxJobSecretBytes. The environment is read at
// every call, never cached. InvalidArgument naming the file or variable for
// a missing or unreadable file, or a secret shorter than kMinJobSecretBytes.
OMNI_EXPORT absl::StatusOr<std::optional<std::string>> LoadJobSecret(
    const std::string& secret_file);

// A view of `base` that seals every record with `secret` and verifies it on
// every read (see the top of this file). Does not own `base`, which must
// outlive the view. InvalidArgument when the secret is shorter than
// kMinJobSecretBytes; Internal when libsodium cannot be initialised.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<Store>> MakeAuthenticatedStore(Store& base,
                                                                          std::string_view secret);
// The same, owning `base`.
OMNI_EXPORT absl::StatusOr<std::unique_ptr<Store>> MakeAuthenticatedStore(
    std::unique_ptr<Store> base, std::string_view secret);

}  // namespace omni
