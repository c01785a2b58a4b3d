// Streams a file's bytes with direct I/O (private; the bulk of a shard).
//
// The bytes given to Append fill one of a bounded number of aligned blocks;
// each full block is copied (large pieces; small ones are copied at once)
// and written with O_DIRECT at its offset by one of `depth` writer threads,
// while the caller hashes the next block's bytes. Append returns once every
// byte it was given is copied (the caller may then free or change them), so
// copying, hashing and writing overlap, several requests stay in flight, and
// no byte goes through the page cache (the buffered path copied every byte there and left the
// kernel's write-back to issue the requests; benchmarks/checkpoint_bench.cc compares both with the
// best O_DIRECT stream). Finish writes the last aligned part the same way, switches the file back
// to buffered I/O and writes the unaligned tail (less than kDirectIoAlign bytes) through the page
// cache; the caller's fsync then makes it all durable. The file keeps its exact length: nothing is
// padded.
//
// Every write goes through the FileSystem seam (common/fs.h), so the fault
// injection of tests sees and fails them like any other; the first error is
// latched and returned by the next Append or Finish.
//
// Memory: at most depth + 1 blocks, mapped as they are first needed (a
// shard smaller than a block maps one, touched only as far as it is filled).
//
// Thread safety: Append and Finish are called by one thread; the writer
// threads are internal and joined by Finish or the destructor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/fs.h"
#include "omni/hash.h"

namespace omni::ckpt {

struct DirectIoOptions {
  bool enabled = true;
  size_t block_bytes = size_t{8} << 20;  // a multiple of internal::kDirectIoAlign
  int depth = 4;                         // writes in flight (writer threads), >= 1
};

class DirectWriter {
 public:
  // Switches `fd` (the open file at `path`) to direct I/O through `fs`, to
  // be written from `offset` (a multiple of kDirectIoAlign) on. The error of
  // switching (Unimplemented, or EINVAL where the file system has no direct
  // I/O) means: write this file buffered. InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<DirectWriter>> Start(internal::FileSystem& fs, int fd,
                                                             std::string path, uint64_t offset,
                                                             const DirectIoOptions& options);
  DirectWriter(internal::FileSystem& fs, int fd, std::string path, uint64_t offset,
               const DirectIoOptions& options);  // use Start
  // Stops the writers (queued blocks are dropped) and joins them; the file
  // is then incomplete and still in direct I/O mode.
  ~DirectWriter();
  DirectWriter(const DirectWriter&) = delete;
  DirectWriter& operator=(const DirectWriter&) = delete;

  // Appends `n` bytes, updating `hash` with them.
  absl::Status Append(const void* data, size_t n, Xxh3& hash);
  // Writes everything appended (see above) and leaves `fd` in buffered
  // mode. Returns the first error of any write.
  absl::Status Finish();
  // Bytes appended so far.
  uint64_t bytes() const { return appended_; }

 private:
  struct Block {
    char* data = nullptr;
    size_t size = 0;
  };
  // Bytes of the caller's still to be copied into a block (at `at`).
  struct Copy {
    const char* from = nullptr;
    size_t at = 0;
    size_t len = 0;
  };
  struct Job {
    size_t block = 0;  // index into blocks_
    uint64_t offset = 0;
    size_t len = 0;
    std::vector<Copy> copies;  // done by the writer before it writes
  };
  // Copies the current block's deferred pieces on this thread.
  void CopyDeferred();
  bool Copied() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return copies_pending_ == 0; }
  // Hands the current block's first `len` bytes to the writers.
  void Submit(size_t len);
  // The index of a free block (maps one while fewer than depth + 1 exist,
  // waits for a writer otherwise); the latched error when a write failed.
  absl::StatusOr<size_t> TakeFree();
  void WriterLoop();
  void StopAndJoin();
  bool HasJob() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_; }
  bool CanTake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !free_.empty() || blocks_.size() < max_blocks_ || !error_.ok();
  }
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && in_flight_ == 0;
  }

  internal::FileSystem& fs_;
  const int fd_;
  const std::string path_;
  const uint64_t start_;
  const size_t block_bytes_;
  const size_t max_blocks_;
  const int depth_;

  // Owned by the calling thread.
  uint64_t appended_ = 0;
  int64_t current_ = -1;        // the block being filled, or -1
  size_t filled_ = 0;           // bytes in it
  std::vector<Copy> deferred_;  // pieces of it not copied yet
  bool finished_ = false;

  absl::Mutex mu_;
  std::vector<Block> blocks_ ABSL_GUARDED_BY(mu_);  // mapped; unmapped by the destructor
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int copies_pending_ ABSL_GUARDED_BY(mu_) = 0;  // submitted jobs not yet copied
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // started with the first full block
};

}  // namespace omni::ckpt
