// Checkpoints: one directory per step,
//
//   <dir>/step-000000001200/manifest.json
//   <dir>/step-000000001200/rank-00000.safetensors   (one shard per rank)
//
// manifest.json (format "omni.checkpoint", version 1):
//
//   {"format":"omni.checkpoint","version":1,"step":1200,"world_size":1,
//    "library_version":"0.1.0","job_id":"...","created_unix_ms":...,
//    "metadata":{"k":"v"},
//    "shards":[{"rank":0,"file":"rank-00000.safetensors","bytes":N,
//               "header_bytes":H,"header_xxh3":"16hex","xxh3":"16hex"}],
//    "entries":{"model/w":{"shard":0,"dtype":"F32","shape":[4,4],
//                          "data_offsets":[0,64],"xxh3":"16hex"}}}
//
// Checksums are XXH3-64 (seed 0) as 16 hex digits: per entry, of its bytes;
// per shard, `header_xxh3` of its first H bytes (length prefix, JSON header
// and padding) and `xxh3` of its entries' checksums (8 bytes little-endian
// each, in data order). The entries fill the data section back to back and
// the file size is recorded, so every byte of a shard is covered (and the
// data is hashed once, while it is written). data_offsets are relative to
// the data section, as in safetensors. With world_size > 1 the same key may
// occur in several shards, so entry names are "<rank>:<key>" and each entry
// also carries "key" (':' never occurs in a key).
//
// Shards are plain safetensors files (readable by any safetensors reader):
// an 8-byte little-endian header length, a JSON header padded with spaces to
// a multiple of 8, then the tensors' bytes back to back; the header's
// "__metadata__" holds format, step, rank, world_size, job_id and a random
// save_id.
//
// Commit: everything is written under <dir>/.tmp-step-<step>, each file
// fsynced, the manifest last, the directory fsynced, then renamed into place
// (an existing checkpoint of the same step is replaced atomically) and the
// parent fsynced: a directory without a valid manifest is not a checkpoint.
// With world_size > 1 (ranks sharing `dir`) every rank writes its shard and a
// fragment describing it into the temporary directory; rank 0 waits for all
// fragments (polling, bounded by shard_timeout), writes the manifest and
// renames; the other ranks wait (bounded) until the manifest holding their
// shard is in place. All ranks must Open before any of them saves (any
// collective between Open and the first save guarantees it), and save the
// same steps in the same order.
//
// Retention (rank 0, after each commit) counts valid checkpoints only (an
// invalid one is neither counted nor deleted, so the newest valid one always
// stays), renames what it drops to
// <dir>/.trash-* and deletes it on the background thread. Open removes what
// crashed writers left: temporary and trash directories, and files of ranks
// whose lock no live process holds.
//
// Restore: each rank reads its own shard, once, verifying every checksum
// as the bytes land in the state objects (see Restore for what a corrupt
// shard leaves). Ranks choose independently; in a multi-rank job, agree on
// a step (e.g. the minimum over ranks of RestoreResult::info.step) and pass
// it to Restore when they differ.
//
// Thread safety: a CheckpointManager is used by one thread (the training
// thread); its asynchronous writer runs on a thread of its own, joined on
// destruction. A forked child inherits the writer lock until it exits or
// execs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/export.h"
#include "omni/state.h"

namespace omni {

struct CheckpointOptions {
  std::string dir;  // root directory (created if missing)
  int rank = 0;
  int world_size = 1;
  std::string job_id;  // recorded in the manifest; a restore refuses another job's
  // Retention: keep the newest keep_last checkpoints, plus every one whose
  // step is a multiple of keep_every (0 = none). keep_last >= 1.
  int keep_last = 3;
  int64_t keep_every = 0;
  // Asynchronous saves: the host memory a pending snapshot may hold; a state
  // larger than this is saved synchronously.
  size_t max_snapshot_bytes = size_t{8} << 30;
  // Keep the host memory of the last snapshot for the next SaveAsync, so
  // that taking a snapshot is a plain copy (no page faults); false returns
  // it to the system after every write.
  bool keep_snapshot_memory = true;
  // When a new asynchronous save is requested while one is still being
  // written: wait for it (true) or skip the new one (false).
  bool wait_for_pending = true;
  // How long rank 0 waits for the other ranks' shards before giving up.
  absl::Duration shard_timeout = absl::Minutes(5);
  // Restore (without a step) when the directory holds step directories but
  // none is a valid checkpoint: false refuses (FailedPrecondition naming
  // each one and why), so that a job never silently starts over from step 0;
  // true returns NotFound as for an empty directory (start from scratch).
  bool start_fresh = false;
  // Write shards with direct I/O where the file system allows it: the bytes
  // are split into a few aligned 8 MiB blocks, copied and written with
  // O_DIRECT by background threads (four requests in flight) while the
  // caller hashes, bypassing the page cache (at most 40 MiB of extra memory
  // per save; the unaligned last bytes go through the page cache). Off by
  // default: on this project's benchmark disk it measured slower than the
  // buffered path (docs/preemption.md, "Benchmarks"). Where O_DIRECT is
  // refused (e.g. an old tmpfs) shards are written through the page cache.
  // The files are the same either way.
  bool direct_io = false;
  // Read-only: Open neither creates the directory nor takes the writer lock
  // (so it works beside a live writer, and on a directory nobody may write
  // to), removes no temporary files, and no retention ever runs; Save and
  // SaveAsync fail with FailedPrecondition. List and Restore work as usual
  // (rank and world_size pick the shard; job_id and start_fresh apply).
  // Open fails with NotFound when the directory does not exist.
  bool read_only = false;
};

struct CheckpointInfo {
  int64_t step = 0;
  std::string path;  // the step directory
  int world_size = 1;
  int format_version = 0;
  std::string library_version;
  std::string job_id;
  int64_t bytes = 0;  // all shards
  int64_t created_unix_ms = 0;
  std::map<std::string, std::string> metadata;
};

struct SaveStats {
  int64_t bytes = 0;        // this rank's shard; its data only when background; 0 if skipped
  double snapshot_s = 0;    // time the caller was blocked copying state (async)
  double write_s = 0;       // time to write, fsync and commit (0 while in the background)
  bool background = false;  // SaveAsync: the write continues on the background thread
  bool skipped = false;     // SaveAsync with wait_for_pending = false found one pending
};

class OMNI_EXPORT CheckpointManager {
 public:
  // Limits on what is read (parsing costs tens of times the bytes in
  // memory; a file over a limit is refused with ResourceExhausted naming it,
  // before it is read, and a save that would write one fails the same way):
  // manifest.json and the per-rank fragments, and a shard's safetensors
  // JSON header (ckpt/safetensors.h, 16 MiB).
  static constexpr size_t kMaxManifestBytes = size_t{64} << 20;
  static constexpr size_t kMaxShardHeaderBytes = size_t{16} << 20;

  // Creates the directory, takes the writer lock for (dir, rank) — an flock
  // that the kernel releases when a writer dies, so a crash never leaves it
  // stuck; FailedPrecondition naming the directory when another live process
  // holds it — and removes temporary and orphaned files left by crashed
  // writers. With read_only, none of that: the directory is only opened
  // (NotFound when missing) and nothing in it is ever changed.
  //
  // Nothing inside `dir` is followed out of it: every entry is opened
  // relative to the directory without following symbolic links, and only
  // regular files are read (a FIFO or device is refused without blocking).
  // A lock, temporary or trash entry that is a symbolic link (or not of its
  // kind) makes Open fail with FailedPrecondition naming it; its target is
  // never touched. A step directory that is a symbolic link is reported as
  // invalid and never read or deleted.
  static absl::StatusOr<std::unique_ptr<CheckpointManager>> Open(const CheckpointOptions& options);
  virtual ~CheckpointManager() = default;

  // Saves `state` as checkpoint `step` (0 <= step < 10^12), durable when
  // this returns OK; a checkpoint of the same step is replaced
  // (FailedPrecondition, writing nothing, when read_only). A process
  // over its file size limit (RLIMIT_FSIZE) gets ResourceExhausted (EFBIG)
  // here like any full disk: Open ignores SIGXFSZ when its disposition is
  // the default (which would kill the process without a word). Tensors are
  // streamed from the caller's memory to the file (no copy of the state is
  // held). On any error (e.g. ResourceExhausted for a full disk, naming the
  // file) the partial files are removed and every earlier checkpoint is
  // untouched. Waits for a pending asynchronous save first (its error stays
  // latched for WaitForPending). Rank 0 applies retention after a
  // successful commit (best effort: a checkpoint that cannot be removed now
  // is removed by a later save).
  virtual absl::StatusOr<SaveStats> Save(int64_t step, const StateRegistry& state,
                                         const std::map<std::string, std::string>& metadata) = 0;
  // Copies the state into host memory now and writes it on the background
  // thread; returns once the copy is taken (SaveStats::snapshot_s is the
  // training-thread stall, SaveStats::background is true). A state larger
  // than max_snapshot_bytes is saved synchronously instead (background
  // false). While an earlier write is pending, waits for it
  // (wait_for_pending) or returns OK at once with skipped = true and
  // bytes = 0. Errors of a background write latch: the next SaveAsync (or
  // WaitForPending) returns the error once, without starting a new save.
  // FailedPrecondition, copying nothing, when read_only.
  virtual absl::StatusOr<SaveStats> SaveAsync(
      int64_t step, const StateRegistry& state,
      const std::map<std::string, std::string>& metadata) = 0;
  // Waits for a pending asynchronous save; returns its result (OK when none
  // is pending and no error is latched). DeadlineExceeded naming the step
  // when it is still being written after `timeout`.
  virtual absl::Status WaitForPending(absl::Duration timeout = absl::InfiniteDuration()) = 0;

  // Valid checkpoints (manifest present and consistent, every shard file of
  // the recorded size, each shard's header as the manifest records it; the
  // data's checksums are not read), newest first.
  virtual absl::StatusOr<std::vector<CheckpointInfo>> List() const = 0;

  // Loads the newest valid checkpoint (or `step`) into `state`, reading
  // this rank's shard once: its size and header are checked against the
  // manifest first, then the objects load straight from the file and every
  // tensor is checked against its checksum where it lands (entries no Load
  // read are checked after the load), so a successful restore has checked
  // every checksum. A checkpoint that fails a check is reported in `skipped`
  // (naming the file, and the key for a checksum) and the previous one is
  // tried; when the failure came midway through the load, that previous
  // checkpoint is loaded entirely (every object's Load again), so on success
  // the state is exactly info.step's: no key of the corrupt one survives.
  //
  // Not skipped, but returned: FailedPrecondition for a newer format version
  // (naming the version and path), another job's checkpoint (both job ids,
  // when both are set) or a checkpoint without a shard for this rank; the
  // error of a Stateful's Load (other shapes or missing keys, naming the key
  // and file), after which earlier checkpoints stay loadable by `step`. With
  // `step`, only that checkpoint is tried and its error is returned.
  // NotFound when there is no valid checkpoint (listing what was skipped)
  // and no object was loaded: the directory holds no step directory, or
  // start_fresh is set. Without start_fresh, a directory whose step
  // directories are all invalid is FailedPrecondition naming each one (a job
  // must not silently start over).
  //
  // On an error other than NotFound, the objects may hold a partial state:
  // DataLoss (naming the file and key) when a checksum failed midway and no
  // older checkpoint could be loaded in full, or when `step` was corrupt;
  // such errors say "partially loaded" and name the checkpoint. Re-initialize
  // the objects, or restore an older `step`, before training on. (A Stateful
  // that checks keys and shapes before overwriting, as Load should, leaves
  // its object untouched on a structural error.)
  //
  // Waits for a pending asynchronous save first.
  struct RestoreResult {
    CheckpointInfo info;
    std::vector<std::string> skipped;  // why newer checkpoints were not used
  };
  virtual absl::StatusOr<RestoreResult> Restore(const StateRegistry& state,
                                                std::optional<int64_t> step = std::nullopt) = 0;
};

// For tools: every valid checkpoint under `dir`, newest first (as List).
OMNI_EXPORT absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& dir);

// For tools: every step directory under `dir`, newest first, valid or not.
// `status` says why one is not a valid checkpoint (the cheap checks of List;
// `info` holds what the manifest told, if anything).
struct CheckpointStatus {
  CheckpointInfo info;
  absl::Status status;
};
OMNI_EXPORT absl::StatusOr<std::vector<CheckpointStatus>> ScanCheckpoints(const std::string& dir);

// Verifies the manifest, every shard (size, header) and every checksum of
// the checkpoint at `path` (a step directory). DataLoss naming the file and
// key at the first mismatch; FailedPrecondition for a newer format version.
OMNI_EXPORT absl::Status VerifyCheckpoint(const std::string& path);
// A human-readable description of the checkpoint at `path` (manifest and
// entries).
OMNI_EXPORT absl::StatusOr<std::string> DescribeCheckpoint(const std::string& path);

}  // namespace omni
