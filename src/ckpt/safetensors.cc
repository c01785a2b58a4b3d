#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fs.h"
#include "common/strings.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoints store tensors as raw little-endian bytes");

namespace omni::ckpt {

using internal::ErrnoStatus;
using internal::Sv;
using nlohmann::json;

namespace {

constexpr size_t kStageBytes = size_t{8} << 20;          // staging buffer for small tensors
constexpr size_t kDirectBytes = size_t{1} << 20;         // tensors this large skip the stage
constexpr size_t kPieceBytes = size_t{8} << 20;          // hash then write, cache-warm
constexpr uint64_t kKickBytes = uint64_t{32} << 20;      // start writeback this often
constexpr size_t kReadBytes = size_t{16} << 20;          // verification read size
constexpr uint64_t kLoadPieceBytes = uint64_t{8} << 20;  // read then hash (see ShardReader)
constexpr uint64_t kMaxHeader = kMaxHeaderBytes;  // safetensors allows 100 MB; see the header

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void StoreLe64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

absl::Status DataLoss(const std::string& path, std::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", Sv(what)));
}

}  // namespace

// ---------------------------------------------------------------- I/O helpers

absl::Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, absl::StrCat("read ", path));
    }
    if (r == 0) {
      return DataLoss(path,
                      absl::StrCat("unexpected end of file at byte ", offset, " (truncated?)"));
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  if (::fsync(fd.get()) != 0 && errno != EINVAL && errno != ENOTSUP) {
    return ErrnoStatus(errno, absl::StrCat("fsync directory ", dir));
  }
  return absl::OkStatus();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// ---------------------------------------------------------------- header

bool ByOffset(const TensorEntry& a, const TensorEntry& b) {
  if (a.begin != b.begin) return a.begin < b.begin;
  if (a.end != b.end) return a.end < b.end;
  return a.key < b.key;
}

uint64_t EntriesDigest(const std::vector<TensorEntry>& entries) {
  std::vector<const TensorEntry*> sorted;
  sorted.reserve(entries.size());
  for (const TensorEntry& e : entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return ByOffset(*a, *b); });
  Xxh3 h;
  for (const TensorEntry* e : sorted) {
    char le[8];
    StoreLe64(e->xxh3, le);
    h.Update(le, sizeof(le));
  }
  return h.Digest();
}

std::string HeaderJson(const std::vector<TensorEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  for (const TensorEntry& e : entries) {
    j[e.key] = {
        {"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  if (!metadata.empty()) j["__metadata__"] = metadata;
  // Invalid UTF-8 in user metadata is replaced rather than thrown.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

uint64_t HeaderBytesFor(size_t json_size) { return 8 + ((json_size + 7) / 8) * 8; }

// ---------------------------------------------------------------- writer

ShardWriter::ShardWriter(internal::FileSystem& fs, std::string path, Fd fd, uint64_t reserve)
    : fs_(fs), path_(std::move(path)), fd_(std::move(fd)), data_start_(reserve) {}

absl::StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(internal::FileSystem& fs, int dir,
                                                                 const std::string& name,
                                                                 std::string path,
                                                                 uint64_t header_reserve,
                                                                 const DirectIoOptions& direct) {
  if (header_reserve < 16 || header_reserve % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("header reserve ", header_reserve, " is not a multiple of 8 >= 16"));
  }
  // Read-write: a header that outgrows its reserve moves the data.
  absl::StatusOr<Fd> fd = fs.OpenWrite(dir, name, /*truncate=*/true, /*exclusive=*/false, path);
  if (!fd.ok()) return fd.status();
  if (direct.enabled) {
    const uint64_t align = internal::kDirectIoAlign;
    const uint64_t reserve = (header_reserve + align - 1) / align * align;
    absl::StatusOr<std::unique_ptr<DirectWriter>> d =
        DirectWriter::Start(fs, fd->get(), path, reserve, direct);
    if (d.ok()) {
      auto w = std::make_unique<ShardWriter>(fs, std::move(path), *std::move(fd), reserve);
      w->direct_ = *std::move(d);
      return w;
    }
    // Refused (no O_DIRECT here): buffered, as below.
  }
  return std::make_unique<ShardWriter>(fs, std::move(path), *std::move(fd), header_reserve);
}

absl::Status CheckPut(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                      const void* data, size_t nbytes) {
  if (!IsValidStateKey(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", Sv(key), "' is malformed (use [A-Za-z0-9_.-/], no empty component)"));
  }
  absl::StatusOr<size_t> want = TensorBytes(dtype, shape);
  if (!want.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key '", Sv(key), "': ", want.status().message()));
  }
  if (*want != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Sv(key), "': ", nbytes,
                                                   " bytes given, ", DTypeName(dtype), " ",
                                                   ShapeString(shape), " needs ", *want));
  }
  if (data == nullptr && nbytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Sv(key), "': data is null"));
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                                    const void* data, size_t nbytes) {
  if (!error_.ok()) return error_;
  if (absl::Status st = CheckPut(key, dtype, shape, data, nbytes); !st.ok()) return st;
  std::string k(key);
  if (keys_.count(k) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate key '", k, "'"));
  }
  TensorEntry e;
  e.key = k;
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.begin = data_end_;
  Xxh3 h;
  if (absl::Status st = Append(data, nbytes, h); !st.ok()) {
    error_ = st;
    return st;
  }
  e.end = data_end_;
  e.xxh3 = h.Digest();
  keys_.insert(std::move(k));
  entries_.push_back(std::move(e));
  return absl::OkStatus();
}

absl::Status ShardWriter::PutBytes(std::string_view key, std::string_view bytes) {
  return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                   bytes.size());
}

absl::Status ShardWriter::Append(const void* data, size_t n, Xxh3& hash) {
  if (direct_ != nullptr) {
    if (absl::Status st = direct_->Append(data, n, hash); !st.ok()) return st;
    data_end_ += n;
    return absl::OkStatus();
  }
  const char* p = static_cast<const char*>(data);
  if (n < kDirectBytes) {
    if (stage_.size() + n > kStageBytes) {
      if (absl::Status st = FlushStage(); !st.ok()) return st;
    }
    if (stage_.empty()) {
      stage_.reserve(kStageBytes);
      stage_offset_ = data_end_;
    }
    stage_.insert(stage_.end(), p, p + n);
    hash.Update(p, n);
    data_end_ += n;
    return absl::OkStatus();
  }
  if (absl::Status st = FlushStage(); !st.ok()) return st;
  while (n > 0) {
    const size_t c = std::min(n, kPieceBytes);
    hash.Update(p, c);
    if (absl::Status st = fs_.Write(fd_.get(), p, c, data_start_ + data_end_, path_); !st.ok()) {
      return st;
    }
    p += c;
    n -= c;
    data_end_ += c;
    if (absl::Status st = Kick(false); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::FlushStage() {
  if (stage_.empty()) return absl::OkStatus();
  if (absl::Status st =
          fs_.Write(fd_.get(), stage_.data(), stage_.size(), data_start_ + stage_offset_, path_);
      !st.ok()) {
    return st;
  }
  stage_.clear();
  return Kick(false);
}

// Starts writeback of what was written since the last kick (a hint: errors
// surface at fsync).
absl::Status ShardWriter::Kick(bool all) {
  const uint64_t flushed = stage_.empty() ? data_end_ : stage_offset_;
  if (flushed <= kicked_ || (!all && flushed - kicked_ < kKickBytes)) return absl::OkStatus();
#ifdef __linux__
  ::sync_file_range(fd_.get(), static_cast<off_t>(data_start_ + kicked_),
                    static_cast<off_t>(flushed - kicked_), SYNC_FILE_RANGE_WRITE);
#endif
  kicked_ = flushed;
  return absl::OkStatus();
}

// Moves the data section to `new_start` (> data_start_), from the end
// backwards so that no byte is overwritten before it was copied.
absl::Status ShardWriter::MoveData(uint64_t new_start) {
  std::vector<char> buf(std::min<uint64_t>(kReadBytes, std::max<uint64_t>(data_end_, 1)));
  uint64_t left = data_end_;
  while (left > 0) {
    const uint64_t c = std::min<uint64_t>(left, buf.size());
    left -= c;
    if (absl::Status st = PreadAll(fd_.get(), buf.data(), c, data_start_ + left, path_); !st.ok()) {
      return st;
    }
    if (absl::Status st = fs_.Write(fd_.get(), buf.data(), c, new_start + left, path_); !st.ok()) {
      return st;
    }
  }
  data_start_ = new_start;
  return absl::OkStatus();
}

absl::StatusOr<ShardSummary> ShardWriter::Finish(
    const std::map<std::string, std::string>& metadata) {
  if (!error_.ok()) return error_;
  absl::Status st;
  if (direct_ != nullptr) {
    st = direct_->Finish();  // leaves the file in buffered mode
    direct_.reset();
  }
  if (st.ok()) st = FlushStage();
  std::string json_text;
  if (st.ok()) {
    json_text = HeaderJson(entries_, metadata);
    const uint64_t need = HeaderBytesFor(json_text.size());
    if (need > kMaxHeader) {
      st = absl::InvalidArgumentError(
          absl::StrCat(path_, ": header of ", need, " bytes exceeds the limit of ", kMaxHeader,
                       " bytes a reader accepts (too many tensors in one shard)"));
    } else if (need > data_start_) {
      st = MoveData(need);
    }
  }
  ShardSummary out;
  if (st.ok()) {
    std::string header(data_start_, ' ');
    StoreLe64(data_start_ - 8, header.data());
    std::memcpy(header.data() + 8, json_text.data(), json_text.size());
    out.header_xxh3 = Xxh3Of(header.data(), header.size());
    st = fs_.Write(fd_.get(), header.data(), header.size(), 0, path_);
  }
  if (st.ok()) st = fs_.Sync(fd_.get(), path_);
  if (st.ok()) st = fd_.Close(path_);
  if (!st.ok()) {
    error_ = st;
    return st;
  }
  out.file_bytes = data_start_ + data_end_;
  out.header_bytes = data_start_;
  out.header_json_bytes = json_text.size();
  out.xxh3 = EntriesDigest(entries_);
  out.entries = std::move(entries_);
  entries_.clear();
  return out;
}

// ---------------------------------------------------------------- reading

absl::StatusOr<ShardHeader> ReadShardHeader(int fd, const std::string& path, uint64_t file_size) {
  if (file_size < 8) {
    return DataLoss(path, absl::StrCat(file_size, " bytes: too short for a safetensors file"));
  }
  unsigned char len_le[8];
  if (absl::Status st = PreadAll(fd, len_le, 8, 0, path); !st.ok()) return st;
  const uint64_t n = LoadLe64(len_le);
  if (n > kMaxHeader && n <= file_size - 8) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": header of ", n, " bytes is over the limit of ", kMaxHeader, " bytes; not read"));
  }
  if (n < 2 || n > kMaxHeader || n > file_size - 8) {
    return DataLoss(path, absl::StrCat("header length ", n, " is impossible for a file of ",
                                       file_size, " bytes"));
  }
  std::string text(n, '\0');
  if (absl::Status st = PreadAll(fd, text.data(), n, 8, path); !st.ok()) return st;
  ShardHeader out;
  out.header_bytes = 8 + n;
  {
    Xxh3 h;
    h.Update(len_le, 8);
    h.Update(text.data(), text.size());
    out.header_xxh3 = h.Digest();
  }
  if (text[0] != '{') return DataLoss(path, "header does not start with '{'");
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(path, "header is not a JSON object");
  const uint64_t data_size = file_size - out.header_bytes;
  try {
    for (const auto& [key, v] : j.items()) {
      if (key == "__metadata__") {
        if (!v.is_object()) return DataLoss(path, "__metadata__ is not an object");
        for (const auto& [mk, mv] : v.items()) {
          if (!mv.is_string())
            return DataLoss(path, absl::StrCat("__metadata__ '", mk, "' is not a string"));
          out.metadata[mk] = mv.get<std::string>();
        }
        continue;
      }
      const std::string where = absl::StrCat("key '", key, "': ");
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
          !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
          !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
        return DataLoss(path,
                        absl::StrCat(where, "needs dtype, shape and data_offsets [begin,end]"));
      }
      TensorEntry e;
      e.key = key;
      absl::StatusOr<DType> dt = ParseDType(v["dtype"].get<std::string>());
      if (!dt.ok()) return DataLoss(path, absl::StrCat(where, dt.status().message()));
      e.dtype = *dt;
      for (const json& d : v["shape"]) {
        if (!d.is_number_integer())
          return DataLoss(path, absl::StrCat(where, "shape is not integers"));
        e.shape.push_back(d.get<int64_t>());
      }
      const json& off = v["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
        return DataLoss(path, absl::StrCat(where, "data_offsets are not unsigned integers"));
      }
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      absl::StatusOr<size_t> want = TensorBytes(e.dtype, e.shape);
      if (!want.ok()) return DataLoss(path, absl::StrCat(where, want.status().message()));
      if (e.end < e.begin || e.end - e.begin != *want) {
        return DataLoss(path, absl::StrCat(where, "data_offsets [", e.begin, ",", e.end,
                                           "] do not hold ", DTypeName(e.dtype), " ",
                                           ShapeString(e.shape), " (", *want, " bytes)"));
      }
      out.entries.push_back(std::move(e));
    }
  } catch (const json::exception& ex) {
    return DataLoss(path, absl::StrCat("malformed header: ", ex.what()));
  }
  std::sort(out.entries.begin(), out.entries.end(), ByOffset);
  uint64_t pos = 0;
  for (const TensorEntry& e : out.entries) {
    if (e.begin != pos) {
      return DataLoss(path, absl::StrCat("key '", e.key, "' starts at ", e.begin, ", expected ",
                                         pos, " (tensors must be back to back)"));
    }
    pos = e.end;
  }
  if (pos != data_size) {
    return DataLoss(path, absl::StrCat("tensors hold ", pos, " bytes but the data section has ",
                                       data_size, " (truncated or padded file)"));
  }
  return out;
}

absl::StatusOr<Fd> OpenShardAsRecorded(internal::FileSystem& fs, int dir, const std::string& file,
                                       const std::string& path, const RecordedShard& rec) {
  absl::StatusOr<Fd> opened = fs.OpenRead(dir, file, path);
  if (!opened.ok()) return opened.status();
  Fd fd = *std::move(opened);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size != rec.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes, the manifest says ",
                                            rec.bytes, " (truncated or replaced?)"));
  }
  absl::StatusOr<ShardHeader> h = ReadShardHeader(fd.get(), path, size);
  if (!h.ok()) return h.status();
  if (h->header_bytes != rec.header_bytes || h->header_xxh3 != rec.header_xxh3) {
    return absl::DataLossError(
        absl::StrCat(path, ": header differs from the one the manifest records (header_xxh3 ",
                     HexDigest(h->header_xxh3), ", manifest ", HexDigest(rec.header_xxh3), ")"));
  }
  const std::vector<TensorEntry>& want = *rec.entries;
  if (h->entries.size() != want.size()) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", h->entries.size(), " tensors, the manifest lists ", want.size()));
  }
  for (size_t i = 0; i < want.size(); ++i) {  // both sorted by offset
    const TensorEntry& x = h->entries[i];
    const TensorEntry& y = want[i];
    if (x.key != y.key || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin ||
        x.end != y.end) {
      return absl::DataLossError(absl::StrCat(
          path, ": key '", y.key, "' is ", DTypeName(y.dtype), " ", ShapeString(y.shape), " at [",
          y.begin, ",", y.end, "] in the manifest, but the file has key '", x.key, "' ",
          DTypeName(x.dtype), " ", ShapeString(x.shape), " at [", x.begin, ",", x.end, "]"));
    }
  }
  return fd;
}

absl::StatusOr<uint64_t> HeaderJsonBytes(internal::FileSystem& fs, int dir, const std::string& name,
                                         const std::string& path) {
  absl::StatusOr<Fd> fd = fs.OpenRead(dir, name, path);
  if (!fd.ok()) return fd.status();
  unsigned char len_le[8];
  if (absl::Status st = PreadAll(fd->get(), len_le, 8, 0, path); !st.ok()) return st;
  const uint64_t n = LoadLe64(len_le);
  if (n > kMaxHeader) return DataLoss(path, absl::StrCat("header length ", n, " is impossible"));
  std::string text(n, '\0');
  if (absl::Status st = PreadAll(fd->get(), text.data(), n, 8, path); !st.ok()) return st;
  const size_t last = text.find_last_not_of(' ');
  return last == std::string::npos ? 0 : last + 1;
}

absl::Status VerifyShardData(int fd, const std::string& path, uint64_t data_start,
                             const std::vector<TensorEntry>& entries) {
  uint64_t total = 0;
  for (const TensorEntry& e : entries) {
    if (e.begin != total) {
      return DataLoss(path, absl::StrCat("key '", e.key, "' is not where the previous ends"));
    }
    total = e.end;
  }
#ifdef POSIX_FADV_SEQUENTIAL
  ::posix_fadvise(fd, static_cast<off_t>(data_start), static_cast<off_t>(total),
                  POSIX_FADV_SEQUENTIAL);
  // Start reading the whole data section now, so that the disk works while
  // this thread hashes.
  ::posix_fadvise(fd, static_cast<off_t>(data_start), static_cast<off_t>(total),
                  POSIX_FADV_WILLNEED);
#endif
  std::vector<char> buf(
      static_cast<size_t>(std::min<uint64_t>(kReadBytes, std::max<uint64_t>(total, 1))));
  uint64_t buf_pos = 0;  // data-section offset of buf[0]
  uint64_t buf_len = 0;
  for (const TensorEntry& e : entries) {
    Xxh3 h;
    uint64_t pos = e.begin;
    while (pos < e.end) {
      if (pos >= buf_pos + buf_len) {
        buf_pos = pos;
        buf_len = std::min<uint64_t>(buf.size(), total - pos);
        if (absl::Status st = PreadAll(fd, buf.data(), buf_len, data_start + pos, path); !st.ok()) {
          return st;
        }
      }
      const uint64_t take = std::min(e.end, buf_pos + buf_len) - pos;
      h.Update(buf.data() + (pos - buf_pos), take);
      pos += take;
    }
    if (h.Digest() != e.xxh3) {
      return DataLoss(path,
                      absl::StrCat("checksum mismatch for key '", e.key, "' (xxh3 ",
                                   HexDigest(h.Digest()), ", manifest ", HexDigest(e.xxh3), ")"));
    }
  }
  return absl::OkStatus();
}

ShardReader::ShardReader(std::string path, Fd fd, uint64_t data_start,
                         std::vector<TensorEntry> entries)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      data_start_(data_start),
      entries_(std::move(entries)),
      checked_(entries_.size(), false) {
  std::sort(entries_.begin(), entries_.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.key < b.key; });
}

std::unique_ptr<ShardReader> ShardReader::Open(std::string path, Fd fd, uint64_t data_start,
                                               std::vector<TensorEntry> entries) {
#ifdef POSIX_FADV_SEQUENTIAL
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  return std::make_unique<ShardReader>(std::move(path), std::move(fd), data_start,
                                       std::move(entries));
}

const TensorEntry* ShardReader::Lookup(std::string_view key) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const TensorEntry& e, std::string_view k) { return e.key < k; });
  if (it == entries_.end() || it->key != key) return nullptr;
  return &*it;
}

absl::StatusOr<StateReader::Info> ShardReader::Find(std::string_view key) const {
  const TensorEntry* e = Lookup(key);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("key '", Sv(key), "' not found in ", path_));
  }
  Info info;
  info.dtype = e->dtype;
  info.shape = e->shape;
  info.nbytes = static_cast<size_t>(e->end - e->begin);
  return info;
}

absl::Status ShardReader::ReadChecked(const TensorEntry& e, void* dst) const {
  any_read_ = true;
  char* p = static_cast<char*>(dst);
  Xxh3 h;
  for (uint64_t pos = e.begin; pos < e.end;) {
    const uint64_t c = std::min<uint64_t>(e.end - pos, kLoadPieceBytes);
    if (absl::Status st = PreadAll(fd_.get(), p, c, data_start_ + pos, path_); !st.ok()) {
      if (read_error_.ok()) read_error_ = st;
      return st;
    }
    h.Update(p, c);  // while the piece is still in the cache
    p += c;
    pos += c;
  }
  if (h.Digest() != e.xxh3) {
    absl::Status st =
        DataLoss(path_, absl::StrCat("checksum mismatch for key '", e.key, "' (xxh3 ",
                                     HexDigest(h.Digest()), ", manifest ", HexDigest(e.xxh3), ")"));
    if (read_error_.ok()) read_error_ = st;
    return st;
  }
  checked_[static_cast<size_t>(&e - entries_.data())] = true;
  return absl::OkStatus();
}

absl::Status ShardReader::VerifyUnread() const {
  std::vector<const TensorEntry*> left;
  uint64_t most = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (checked_[i]) continue;
    left.push_back(&entries_[i]);
    most = std::max(most, entries_[i].end - entries_[i].begin);
  }
  std::sort(left.begin(), left.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return ByOffset(*a, *b); });
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(kLoadPieceBytes, most)));
  for (const TensorEntry* e : left) {
    Xxh3 h;
    for (uint64_t pos = e->begin; pos < e->end;) {
      const uint64_t c = std::min<uint64_t>(e->end - pos, buf.size());
      if (absl::Status st = PreadAll(fd_.get(), buf.data(), c, data_start_ + pos, path_);
          !st.ok()) {
        return st;
      }
      h.Update(buf.data(), c);
      pos += c;
    }
    if (h.Digest() != e->xxh3) {
      return DataLoss(path_,
                      absl::StrCat("checksum mismatch for key '", e->key, "' (xxh3 ",
                                   HexDigest(h.Digest()), ", manifest ", HexDigest(e->xxh3), ")"));
    }
    checked_[static_cast<size_t>(e - entries_.data())] = true;
  }
  return absl::OkStatus();
}

absl::Status ShardReader::ReadTensor(std::string_view key, DType dtype,
                                     const std::vector<int64_t>& shape, void* dst,
                                     size_t nbytes) const {
  const TensorEntry* e = Lookup(key);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("key '", Sv(key), "' not found in ", path_));
  }
  if (e->dtype != dtype || e->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", Sv(key), "' in ", path_, " is ", DTypeName(e->dtype), " ", ShapeString(e->shape),
        ", expected ", DTypeName(dtype), " ", ShapeString(shape)));
  }
  if (nbytes != e->end - e->begin) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Sv(key), "' in ", path_, " holds ",
                                                   e->end - e->begin, " bytes, the buffer has ",
                                                   nbytes));
  }
  if (dst == nullptr && nbytes > 0) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Sv(key), "': destination is null"));
  }
  return ReadChecked(*e, dst);
}

absl::StatusOr<std::string> ShardReader::ReadBytes(std::string_view key) const {
  const TensorEntry* e = Lookup(key);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("key '", Sv(key), "' not found in ", path_));
  }
  if (e->dtype != DType::kU8 || e->shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("key '", Sv(key), "' in ", path_, " is ",
                                                   DTypeName(e->dtype), " ", ShapeString(e->shape),
                                                   ", not bytes (1-D U8)"));
  }
  std::string out(static_cast<size_t>(e->end - e->begin), '\0');
  if (absl::Status st = ReadChecked(*e, out.data()); !st.ok()) return st;
  return out;
}

std::vector<std::string> ShardReader::Keys(std::string_view prefix) const {
  std::vector<std::string> out;
  auto it = std::lower_bound(entries_.begin(), entries_.end(), prefix,
                             [](const TensorEntry& e, std::string_view k) { return e.key < k; });
  for (; it != entries_.end() && std::string_view(it->key).substr(0, prefix.size()) == prefix;
       ++it) {
    out.push_back(it->key);
  }
  return out;
}

}  // namespace omni::ckpt
