// Safetensors shards (private): a streaming writer that takes tensors
// straight from the caller's memory, header parsing and validation, checksum
// verification, and a StateReader over a verified shard. Plus the small POSIX
// helpers the checkpoint layer shares (an owned fd, full reads / writes,
// directory fsync).
//
// Layout (https://huggingface.co/docs/safetensors): 8-byte little-endian
// header length N, N bytes of JSON ({"key":{"dtype","shape","data_offsets"}},
// "__metadata__":{string: string}), padded with spaces; then the data
// section, tensors back to back, data_offsets relative to its start.
//
// Thread safety: none of these objects is shared between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/direct_writer.h"
#include "common/fs.h"
#include "omni/hash.h"
#include "omni/state.h"

namespace omni::ckpt {

// An owned file descriptor, closed on destruction.
using internal::Fd;

// A full positional read, retrying short transfers and EINTR (writes go
// through the file-system seam, common/fs.h). Errors name `path`; a read
// past the end of the file is DataLoss.
absl::Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path);
// fsync of a directory (so that entries created or renamed in it are
// durable).
absl::Status FsyncDir(const std::string& dir);

// The checks every StateWriter makes on a Put: a well-formed key,
// nbytes == TensorBytes(dtype, shape), data present. InvalidArgument naming
// the key.
absl::Status CheckPut(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                      const void* data, size_t nbytes);

// One tensor of a shard.
struct TensorEntry {
  std::string key;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // in the data section
  uint64_t end = 0;
  uint64_t xxh3 = 0;  // of its bytes (0 when read from a header: safetensors has none)
};

// Orders entries by their place in the data section (zero-size tensors share
// an offset: then by key, so that two sorted lists compare element-wise).
bool ByOffset(const TensorEntry& a, const TensorEntry& b);

// What a finished shard holds (the manifest's "shards" element and entries).
struct ShardSummary {
  std::vector<TensorEntry> entries;  // in file order
  uint64_t file_bytes = 0;
  uint64_t header_bytes = 0;       // 8 + N: where the data section starts
  uint64_t header_json_bytes = 0;  // of N, the JSON without its padding
  uint64_t header_xxh3 = 0;        // of the first header_bytes bytes
  uint64_t xxh3 = 0;               // EntriesDigest(entries)
};

// XXH3 of the entries' checksums (8-byte little-endian each, in ByOffset
// order): the shard-level "xxh3".
uint64_t EntriesDigest(const std::vector<TensorEntry>& entries);

// The JSON header (unpadded) of a shard holding `entries` (offsets set).
std::string HeaderJson(const std::vector<TensorEntry>& entries,
                       const std::map<std::string, std::string>& metadata);
// 8 + the header padded to a multiple of 8: where the data section starts.
uint64_t HeaderBytesFor(size_t json_size);

// Writes one shard. Tensors go to the file as they are put (data section at
// `header_reserve`, the header written last at offset 0; when it outgrows
// the reserve the data is moved once), each hashed on the way.
//
// With direct I/O (the default where the file system has it), the data
// section starts at a multiple of kDirectIoAlign and streams through a
// DirectWriter (ckpt/direct_writer.h): copied into a few aligned blocks,
// hashed there, written with O_DIRECT by background threads, the unaligned
// tail buffered. Without it (direct.enabled false, or the file system
// refuses O_DIRECT, e.g. an old tmpfs): small tensors are gathered into an
// 8 MiB staging buffer, large ones written from the caller's memory in 8 MiB
// pieces through the page cache, with writeback started every 32 MiB so the
// final fsync has little left to do. The file is the same either way.
class ShardWriter final : public StateWriter {
 public:
  // Creates (truncates) the regular file `name` under the directory `dir`
  // (at `path`) through `fs`, which every write and the fsync go through.
  // header_reserve: a multiple of 8, >= 16 (rounded up to kDirectIoAlign
  // for direct I/O).
  static absl::StatusOr<std::unique_ptr<ShardWriter>> Create(
      internal::FileSystem& fs, int dir, const std::string& name, std::string path,
      uint64_t header_reserve, const DirectIoOptions& direct = DirectIoOptions());
  ShardWriter(internal::FileSystem& fs, std::string path, Fd fd,
              uint64_t reserve);  // use Create
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override;
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override;
  // Writes the header, fsyncs and closes the file. After an error of a Put,
  // returns that error.
  absl::StatusOr<ShardSummary> Finish(const std::map<std::string, std::string>& metadata);
  uint64_t data_bytes() const { return data_end_; }
  const std::string& path() const { return path_; }
  // Whether the data goes out with direct I/O.
  bool direct() const { return direct_ != nullptr; }

 private:
  absl::Status Append(const void* data, size_t n, Xxh3& hash);
  absl::Status FlushStage();
  absl::Status Kick(bool all);
  absl::Status MoveData(uint64_t new_start);

  internal::FileSystem& fs_;
  std::string path_;
  Fd fd_;
  uint64_t data_start_;    // file offset of the data section
  uint64_t data_end_ = 0;  // bytes of data section put so far
  std::vector<char> stage_;
  uint64_t stage_offset_ = 0;  // data-section offset of stage_[0]
  uint64_t kicked_ = 0;        // data-section bytes whose writeback was started
  std::vector<TensorEntry> entries_;
  std::unordered_set<std::string> keys_;
  absl::Status error_;  // first I/O error: the file is unusable after it
  // Last: its writer threads stop before fd_ closes.
  std::unique_ptr<DirectWriter> direct_;
};

// A parsed and validated header: entries in file order, metadata.
struct ShardHeader {
  uint64_t header_bytes = 0;  // 8 + N
  uint64_t header_xxh3 = 0;
  std::vector<TensorEntry> entries;
  std::map<std::string, std::string> metadata;
};

// Reads the header of the open shard `path` of `file_size` bytes and checks
// it follows the format: sane length, JSON object, known dtypes, offsets
// matching dtype and shape, tensors back to back filling the data section
// exactly. DataLoss naming the file (and key) otherwise.
absl::StatusOr<ShardHeader> ReadShardHeader(int fd, const std::string& path, uint64_t file_size);

// What a manifest records of one shard (or part) file: its size, its
// header's length and digest, and its entries sorted by offset.
struct RecordedShard {
  uint64_t bytes = 0;
  uint64_t header_bytes = 0;
  uint64_t header_xxh3 = 0;
  const std::vector<TensorEntry>* entries = nullptr;
};
// Opens `file` under the open directory `dir` (at `path`; no symbolic link
// followed) and checks what is cheap to check against the manifest's
// record: its size, and its header (ReadShardHeader): length, digest, and
// every key, dtype, shape and offset. DataLoss naming `path` (and the key)
// when they differ; the FileSystem's and ReadShardHeader's errors.
absl::StatusOr<Fd> OpenShardAsRecorded(internal::FileSystem& fs, int dir, const std::string& file,
                                       const std::string& path, const RecordedShard& rec);

// Reads the data section and checks every entry's checksum (entries sorted by
// offset, covering it exactly). DataLoss naming the file and key.
absl::Status VerifyShardData(int fd, const std::string& path, uint64_t data_start,
                             const std::vector<TensorEntry>& entries);

// A StateReader over a shard whose entries (with checksums) come from the
// manifest: the single pass of a restore. Reads go straight from the file
// into the caller's memory (pread, no intermediate copy), each piece hashed
// where it lands, so every byte is read once and checked in place: in 8 MiB
// pieces, each hashed right after its read, while it is in the CPU cache.
// Reads in file order (the usual case) are sequential, so the kernel's
// read-ahead keeps the disk busy while this thread hashes. (Measured from a
// cold disk: 2 MiB reads were about 25% slower than 8 MiB ones; hashing on a
// second thread, one piece behind the reads, no faster on a busy 2-core
// machine, and slower when that thread was scheduled late; asking the
// kernel to read further ahead (POSIX_FADV_WILLNEED) slower too.)
//
// A checksum mismatch (DataLoss naming the file and key) or a failed read is
// returned and latched: the destination then holds unverified bytes, so the
// caller (Restore) trusts a state loaded through this reader only when
// read_error() is still OK after the load, whatever the Stateful did with
// the error. VerifyUnread() checks the entries no Load read, so that
// a successful restore has checked every checksum of the shard.
class ShardReader final : public StateReader {
 public:
  // `fd`: the open shard at `path` (its header already checked against the
  // manifest); `entries`: the manifest's, sorted by offset, covering the
  // data section that starts at `data_start`.
  static std::unique_ptr<ShardReader> Open(std::string path, Fd fd, uint64_t data_start,
                                           std::vector<TensorEntry> entries);
  ShardReader(std::string path, Fd fd, uint64_t data_start,
              std::vector<TensorEntry> entries);  // use Open
  absl::StatusOr<Info> Find(std::string_view key) const override;
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override;
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override;
  std::vector<std::string> Keys(std::string_view prefix) const override;

  // The first failed read or checksum mismatch of ReadTensor / ReadBytes
  // (OK when none).
  const absl::Status& read_error() const { return read_error_; }
  // Whether a ReadTensor / ReadBytes got past its checks (so a Load may have
  // changed its object).
  bool any_read() const { return any_read_; }
  // Reads and checks every entry that no read has checked yet (in file
  // order). DataLoss naming the file and key at the first mismatch.
  absl::Status VerifyUnread() const;

 private:
  const TensorEntry* Lookup(std::string_view key) const;
  absl::Status ReadChecked(const TensorEntry& e, void* dst) const;

  std::string path_;
  Fd fd_;
  uint64_t data_start_;
  std::vector<TensorEntry> entries_;  // sorted by key
  // Reads change no observable state but these (StateReader is const).
  mutable std::vector<bool> checked_;  // per entry of entries_
  mutable absl::Status read_error_;
  mutable bool any_read_ = false;
};

// "[2,8]"; "[]" for a scalar.
std::string ShapeString(const std::vector<int64_t>& shape);

// The length of the JSON of the header of the shard `name` under `dir` (at
// `path`), without its padding (to size the reserve of the next save).
absl::StatusOr<uint64_t> HeaderJsonBytes(internal::FileSystem& fs, int dir, const std::string& name,
                                         const std::string& path);

// The largest JSON header read or written (CheckpointManager::
// kMaxShardHeaderBytes): parsing one costs tens of times its size.
constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;

}  // namespace omni::ckpt
