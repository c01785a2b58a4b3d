#include "ckpt/direct_writer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace omni::ckpt {

using internal::kDirectIoAlign;

namespace {

// Pieces at least this large are copied by the writer threads (in parallel
// with the caller's hashing); smaller ones by the caller at once.
constexpr size_t kDeferBytes = size_t{256} << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<DirectWriter>> DirectWriter::Start(internal::FileSystem& fs, int fd,
                                                                  std::string path, uint64_t offset,
                                                                  const DirectIoOptions& options) {
  if (options.block_bytes == 0 || options.block_bytes % kDirectIoAlign != 0 || options.depth < 1 ||
      offset % kDirectIoAlign != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": direct I/O needs blocks and an offset aligned to ", kDirectIoAlign,
                     " bytes and a depth >= 1 (block ", options.block_bytes, ", offset ", offset,
                     ", depth ", options.depth, ")"));
  }
  if (absl::Status st = fs.SetDirectIo(fd, true, path); !st.ok()) return st;
  return std::make_unique<DirectWriter>(fs, fd, std::move(path), offset, options);
}

DirectWriter::DirectWriter(internal::FileSystem& fs, int fd, std::string path, uint64_t offset,
                           const DirectIoOptions& options)
    : fs_(fs),
      fd_(fd),
      path_(std::move(path)),
      start_(offset),
      block_bytes_(options.block_bytes),
      max_blocks_(static_cast<size_t>(options.depth) + 1),
      depth_(options.depth) {
  absl::MutexLock l(&mu_);
  blocks_.reserve(max_blocks_);
}

DirectWriter::~DirectWriter() {
  StopAndJoin();
  absl::MutexLock l(&mu_);
  for (const Block& b : blocks_) ::munmap(b.data, b.size);
}

void DirectWriter::StopAndJoin() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

absl::StatusOr<size_t> DirectWriter::TakeFree() {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &DirectWriter::CanTake));
  if (!error_.ok()) return error_;
  if (!free_.empty()) {
    const size_t b = free_.back();
    free_.pop_back();
    return b;
  }
  // Mapped (not from the heap), so that the memory goes back to the system
  // when the shard is done; pages are touched only as they are filled.
  void* p =
      ::mmap(nullptr, block_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return internal::ErrnoStatus(errno,
                                 absl::StrCat("map ", block_bytes_, " bytes for writing ", path_));
  }
  blocks_.push_back({static_cast<char*>(p), block_bytes_});
  return blocks_.size() - 1;
}

void DirectWriter::Submit(size_t len) {
  const size_t b = static_cast<size_t>(current_);
  const uint64_t offset = start_ + appended_ - filled_;
  current_ = -1;
  filled_ = 0;
  if (threads_.empty()) {
    for (int i = 0; i < depth_; ++i) threads_.emplace_back([this] { WriterLoop(); });
  }
  absl::MutexLock l(&mu_);
  if (!deferred_.empty()) ++copies_pending_;
  queue_.push_back({b, offset, len, std::move(deferred_)});
  deferred_.clear();
}

void DirectWriter::WriterLoop() {
  while (true) {
    Job job;
    char* data = nullptr;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &DirectWriter::HasJob));
      if (queue_.empty()) return;  // stopping
      job = std::move(queue_.front());
      queue_.pop_front();
      data = blocks_[job.block].data;
      ++in_flight_;
      if (!error_.ok()) {  // a write failed: drop the rest
        if (!job.copies.empty()) --copies_pending_;
        free_.push_back(job.block);
        --in_flight_;
        continue;
      }
    }
    if (!job.copies.empty()) {
      for (const Copy& c : job.copies) std::memcpy(data + c.at, c.from, c.len);
      absl::MutexLock l(&mu_);
      --copies_pending_;  // the caller's bytes may change from here on
    }
    absl::Status st = fs_.Write(fd_, data, job.len, job.offset, path_);
    absl::MutexLock l(&mu_);
    if (!st.ok() && error_.ok()) error_ = std::move(st);
    free_.push_back(job.block);
    --in_flight_;
  }
}

absl::Status DirectWriter::Append(const void* data, size_t n, Xxh3& hash) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (current_ < 0) {
      absl::StatusOr<size_t> b = TakeFree();
      if (!b.ok()) {
        // A write failed: nothing more is written, but no writer may still
        // be copying the caller's bytes when this returns.
        deferred_.clear();
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(this, &DirectWriter::Copied));
        return b.status();
      }
      current_ = static_cast<int64_t>(*b);
    }
    const size_t take = std::min(n, block_bytes_ - filled_);
    if (take >= kDeferBytes) {
      deferred_.push_back({p, filled_, take});
    } else {
      char* dst = nullptr;
      {
        absl::MutexLock l(&mu_);  // blocks_ grows only on this thread; the lock orders the read
        dst = blocks_[static_cast<size_t>(current_)].data + filled_;
      }
      std::memcpy(dst, p, take);
    }
    hash.Update(p, take);
    p += take;
    n -= take;
    filled_ += take;
    appended_ += take;
    if (filled_ == block_bytes_) Submit(block_bytes_);
  }
  // The caller's bytes must not be needed after this returns.
  CopyDeferred();
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &DirectWriter::Copied));
  return absl::OkStatus();
}

void DirectWriter::CopyDeferred() {
  if (deferred_.empty()) return;
  char* block = nullptr;
  {
    absl::MutexLock l(&mu_);
    block = blocks_[static_cast<size_t>(current_)].data;
  }
  for (const Copy& c : deferred_) std::memcpy(block + c.at, c.from, c.len);
  deferred_.clear();
}

absl::Status DirectWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat(path_, ": finished twice"));
  finished_ = true;
  // The last block: its aligned part direct, the rest (the tail) buffered.
  const size_t aligned = filled_ / kDirectIoAlign * kDirectIoAlign;
  const size_t tail = filled_ - aligned;
  const char* tail_data = nullptr;
  if (current_ >= 0) {
    absl::MutexLock l(&mu_);
    tail_data = blocks_[static_cast<size_t>(current_)].data + aligned;
  }
  const uint64_t tail_offset = start_ + appended_ - tail;
  // The block goes back to the free list once written, but nothing takes
  // it again: its tail stays readable until the destructor.
  if (aligned > 0) Submit(aligned);
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(this, &DirectWriter::Drained));
  }
  StopAndJoin();
  absl::Status st;
  {
    absl::MutexLock l(&mu_);
    st = error_;
  }
  if (!st.ok()) return st;
  if (absl::Status off = fs_.SetDirectIo(fd_, false, path_); !off.ok()) return off;
  if (tail > 0) return fs_.Write(fd_, tail_data, tail, tail_offset, path_);
  return absl::OkStatus();
}

}  // namespace omni::ckpt
