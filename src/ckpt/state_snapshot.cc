#include "ckpt/state_snapshot.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/safetensors.h"
#include "common/fs.h"
#include "common/strings.h"

namespace omni::ckpt {

using internal::ErrnoStatus;
using internal::Sv;

namespace {

constexpr char kMagic[8] = {'O', 'M', 'N', 'I', 'S', 'T', '0', '1'};
// A snapshot block holds at least this much (fewer mappings and faults).
constexpr size_t kMinBlock = size_t{64} << 20;
// Items start at multiples of this in a block.
constexpr size_t kItemAlign = 64;

template <typename T>
void Append(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

}  // namespace

// ---------------------------------------------------------------- HostBlock

absl::StatusOr<HostBlock> HostBlock::Map(size_t size) {
  size = (size + kAlign - 1) / kAlign * kAlign;
  const size_t mapped = size + kAlign;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("map ", size, " bytes for a checkpoint snapshot"));
  }
  const auto base = reinterpret_cast<uintptr_t>(p);
  char* aligned = static_cast<char*>(p) + (kAlign - base % kAlign) % kAlign;
#ifdef MADV_HUGEPAGE
  ::madvise(aligned, size, MADV_HUGEPAGE);  // a hint; fine to fail
#endif
  return HostBlock(static_cast<char*>(p), mapped, aligned, size);
}

HostBlock::HostBlock(HostBlock&& o) noexcept
    : map_(std::exchange(o.map_, nullptr)), mapped_(o.mapped_), p_(o.p_), size_(o.size_) {}

HostBlock& HostBlock::operator=(HostBlock&& o) noexcept {
  if (this != &o) {
    Unmap();
    map_ = std::exchange(o.map_, nullptr);
    mapped_ = o.mapped_;
    p_ = o.p_;
    size_ = o.size_;
  }
  return *this;
}

void HostBlock::Unmap() {
  if (map_ != nullptr) ::munmap(map_, mapped_);
  map_ = nullptr;
}

// ---------------------------------------------------------------- StateSnapshot

class StateSnapshot::Writer final : public StateWriter {
 public:
  Writer(StateSnapshot& snap, size_t max_bytes) : snap_(snap), max_bytes_(max_bytes) {}
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    return snap_.Put(key, dtype, std::move(shape), data, nbytes, max_bytes_);
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                     bytes.size());
  }

 private:
  StateSnapshot& snap_;
  const size_t max_bytes_;
};

absl::Status StateSnapshot::Capture(const StateRegistry& state, size_t max_bytes) {
  Writer w(*this, max_bytes);
  return state.SaveAll(w);
}

absl::Status StateSnapshot::Put(std::string_view key, DType dtype, std::vector<int64_t> shape,
                                const void* data, size_t nbytes, size_t max_bytes) {
  if (absl::Status st = CheckPut(key, dtype, shape, data, nbytes); !st.ok()) return st;
  if (!keys_.insert(std::string(key)).second) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate key '", Sv(key), "'"));
  }
  if (nbytes > max_bytes || bytes_ > max_bytes - nbytes) {
    over_limit_ = true;
    return absl::ResourceExhaustedError("snapshot exceeds max_snapshot_bytes");
  }
  char* dst = nullptr;
  if (nbytes > 0) {
    if (blocks_.empty() || used_ + nbytes > blocks_.back().size()) {
      const size_t want = std::max(nbytes, kMinBlock);
      auto it = std::find_if(pool_.begin(), pool_.end(),
                             [want](const HostBlock& b) { return b.size() >= want; });
      if (it != pool_.end()) {
        blocks_.push_back(std::move(*it));
        pool_.erase(it);
      } else {
        absl::StatusOr<HostBlock> b = HostBlock::Map(want);
        if (!b.ok()) return b.status();
        blocks_.push_back(*std::move(b));
      }
      used_ = 0;
    }
    dst = blocks_.back().data() + used_;
    std::memcpy(dst, data, nbytes);
    used_ += (nbytes + kItemAlign - 1) / kItemAlign * kItemAlign;
  }
  items_.push_back({std::string(key), dtype, std::move(shape), dst, nbytes});
  bytes_ += nbytes;
  return absl::OkStatus();
}

std::vector<HostBlock> StateSnapshot::TakeBlocks() {
  std::vector<HostBlock> out = std::move(blocks_);
  for (HostBlock& b : pool_) out.push_back(std::move(b));
  blocks_.clear();
  pool_.clear();
  items_.clear();
  used_ = 0;
  return out;
}

// ---------------------------------------------------------------- the buffer format

std::string EncodeState(const std::vector<StateItem>& items) {
  size_t total = sizeof(kMagic) + sizeof(uint64_t);
  for (const StateItem& it : items) {
    total += sizeof(uint32_t) + it.key.size() + sizeof(uint8_t) + sizeof(uint32_t) +
             sizeof(int64_t) * it.shape.size() + sizeof(uint64_t) + it.nbytes;
  }
  std::string out;
  out.reserve(total);
  out.append(kMagic, sizeof(kMagic));
  Append(out, static_cast<uint64_t>(items.size()));
  for (const StateItem& it : items) {
    Append(out, static_cast<uint32_t>(it.key.size()));
    out.append(it.key);
    Append(out, static_cast<uint8_t>(it.dtype));
    Append(out, static_cast<uint32_t>(it.shape.size()));
    for (int64_t d : it.shape) Append(out, d);
    Append(out, static_cast<uint64_t>(it.nbytes));
    if (it.nbytes > 0) out.append(it.data, it.nbytes);
  }
  return out;
}

absl::StatusOr<std::vector<StateItem>> DecodeState(std::string_view b) {
  size_t pos = 0;
  const auto need = [&](size_t n) -> absl::Status {
    if (b.size() - pos < n) {
      return absl::DataLossError(
          absl::StrCat("state buffer truncated at byte ", pos, " of ", b.size()));
    }
    return absl::OkStatus();
  };
  const auto read = [&](void* dst, size_t n) {
    std::memcpy(dst, b.data() + pos, n);
    pos += n;
  };
  if (b.size() < sizeof(kMagic) + 8 || std::memcmp(b.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a state buffer (bad magic)");
  }
  pos = sizeof(kMagic);
  uint64_t count = 0;
  read(&count, sizeof(count));
  std::vector<StateItem> items;
  std::unordered_set<std::string_view> seen;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t klen = 0;
    if (auto st = need(4); !st.ok()) return st;
    read(&klen, 4);
    if (auto st = need(size_t{klen} + 5); !st.ok()) return st;
    const std::string_view key(b.data() + pos, klen);
    pos += klen;
    StateItem e;
    e.key = std::string(key);
    uint8_t dtype = 0;
    uint32_t ndim = 0;
    read(&dtype, 1);
    read(&ndim, 4);
    if (dtype > static_cast<uint8_t>(DType::kF64) || ndim > 64) {
      return absl::DataLossError(absl::StrCat("state buffer: bad header of key '", e.key, "'"));
    }
    e.dtype = static_cast<DType>(dtype);
    e.shape.resize(ndim);
    if (auto st = need(8 * static_cast<size_t>(ndim) + 8); !st.ok()) return st;
    for (int64_t& d : e.shape) read(&d, 8);
    uint64_t nbytes = 0;
    read(&nbytes, 8);
    if (auto st = need(nbytes); !st.ok()) return st;
    absl::StatusOr<size_t> expect = TensorBytes(e.dtype, e.shape);
    if (!expect.ok() || *expect != nbytes) {
      return absl::DataLossError(absl::StrCat("state buffer: size of key '", e.key, "'"));
    }
    e.nbytes = nbytes;
    e.data = b.data() + pos;
    pos += nbytes;
    if (!seen.insert(key).second) {
      return absl::DataLossError(absl::StrCat("state buffer: key '", e.key, "' repeated"));
    }
    items.push_back(std::move(e));
  }
  if (pos != b.size()) return absl::DataLossError("state buffer: trailing bytes");
  return items;
}

// ---------------------------------------------------------------- ItemReader

ItemReader::ItemReader(const std::vector<StateItem>& items, std::string source)
    : source_(std::move(source)) {
  for (const StateItem& it : items) by_key_.emplace(it.key, &it);
}

const StateItem* ItemReader::Lookup(std::string_view key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

absl::StatusOr<StateReader::Info> ItemReader::Find(std::string_view key) const {
  const StateItem* it = Lookup(key);
  if (it == nullptr) {
    return absl::NotFoundError(absl::StrCat("state key '", Sv(key), "' missing from ", source_));
  }
  return Info{it->dtype, it->shape, it->nbytes};
}

absl::Status ItemReader::ReadTensor(std::string_view key, DType dtype,
                                    const std::vector<int64_t>& shape, void* dst,
                                    size_t nbytes) const {
  absl::StatusOr<Info> info = Find(key);
  if (!info.ok()) return info.status();
  if (info->dtype != dtype || info->shape != shape || info->nbytes != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state key '", Sv(key), "': received ", DTypeName(info->dtype), " of ", info->nbytes,
        " bytes, expected ", DTypeName(dtype), " of ", nbytes, " bytes (another model?)"));
  }
  if (nbytes > 0) std::memcpy(dst, Lookup(key)->data, nbytes);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ItemReader::ReadBytes(std::string_view key) const {
  absl::StatusOr<Info> info = Find(key);
  if (!info.ok()) return info.status();
  if (info->dtype != DType::kU8 || info->shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("state key '", Sv(key), "' is not a byte blob"));
  }
  const StateItem* it = Lookup(key);
  return it->nbytes == 0 ? std::string() : std::string(it->data, it->nbytes);
}

std::vector<std::string> ItemReader::Keys(std::string_view prefix) const {
  std::vector<std::string> out;
  for (auto it = by_key_.lower_bound(prefix);
       it != by_key_.end() && std::string_view(it->first).substr(0, prefix.size()) == prefix;
       ++it) {
    out.push_back(it->first);
  }
  return out;
}

}  // namespace omni::ckpt
