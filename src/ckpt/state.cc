#include "omni/state.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt/state_snapshot.h"
#include "common/strings.h"

namespace omni {

using internal::Sv;

namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr DTypeRow kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},     {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},   {DType::kI32, "I32", 4},   {DType::kI64, "I64", 8},
    {DType::kF16, "F16", 2},   {DType::kBF16, "BF16", 2}, {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
};

const DTypeRow* RowOf(DType dtype) {
  for (const DTypeRow& r : kDTypes) {
    if (r.dtype == dtype) return &r;
  }
  return nullptr;
}

bool KeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-' || c == '/';
}

// Hands "name/" + key to the registry's writer.
class PrefixWriter final : public StateWriter {
 public:
  PrefixWriter(std::string prefix, StateWriter& inner)
      : prefix_(std::move(prefix)), inner_(inner) {}
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    return inner_.PutTensor(Full(key), dtype, std::move(shape), data, nbytes);
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return inner_.PutBytes(Full(key), bytes);
  }

 private:
  std::string Full(std::string_view key) const { return absl::StrCat(prefix_, Sv(key)); }
  std::string prefix_;
  StateWriter& inner_;
};

// Shows one object only the keys under its "name/" prefix.
class PrefixReader final : public StateReader {
 public:
  PrefixReader(std::string prefix, const StateReader& inner)
      : prefix_(std::move(prefix)), inner_(inner) {}
  absl::StatusOr<Info> Find(std::string_view key) const override { return inner_.Find(Full(key)); }
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override {
    return inner_.ReadTensor(Full(key), dtype, shape, dst, nbytes);
  }
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override {
    return inner_.ReadBytes(Full(key));
  }
  std::vector<std::string> Keys(std::string_view prefix) const override {
    std::vector<std::string> keys = inner_.Keys(Full(prefix));
    for (std::string& k : keys) k.erase(0, prefix_.size());
    return keys;
  }

 private:
  std::string Full(std::string_view key) const { return absl::StrCat(prefix_, Sv(key)); }
  std::string prefix_;
  const StateReader& inner_;
};

// True when `a` equals `b` or is a whole-component prefix of it ("rng" of
// "rng/cuda", not of "rngs").
bool PathPrefix(const std::string& a, const std::string& b) {
  return b.size() >= a.size() && b.compare(0, a.size(), a) == 0 &&
         (b.size() == a.size() || b[a.size()] == '/');
}

}  // namespace

const char* DTypeName(DType dtype) {
  const DTypeRow* r = RowOf(dtype);
  return r != nullptr ? r->name : "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeRow& r : kDTypes) {
    if (name == r.name) return r.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", Sv(name), "'"));
}

size_t DTypeSize(DType dtype) {
  const DTypeRow* r = RowOf(dtype);
  return r != nullptr ? r->size : 0;
}

absl::StatusOr<size_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape) {
  const size_t elem = DTypeSize(dtype);
  if (elem == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
  size_t n = elem;
  for (const int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    const auto ud = static_cast<size_t>(d);
    if (ud != 0 && n > std::numeric_limits<size_t>::max() / ud) {
      return absl::InvalidArgumentError("tensor size overflows");
    }
    n *= ud;
  }
  return n;
}

bool IsValidStateKey(std::string_view key) {
  if (key.empty() || key.size() > 512) return false;
  if (!std::all_of(key.begin(), key.end(), KeyChar)) return false;
  size_t start = 0;
  while (true) {
    const size_t slash = key.find('/', start);
    const std::string_view part =
        key.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string_view::npos) return true;
    start = slash + 1;
  }
}

absl::Status StateRegistry::Register(std::string name, Stateful* object) {
  if (!IsValidStateKey(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state name '", name, "' is malformed (use [A-Za-z0-9_.-/], no empty component)"));
  }
  if (object == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("state '", name, "': object is null"));
  }
  for (const auto& [other, obj] : objects_) {
    if (other == name) {
      return absl::AlreadyExistsError(absl::StrCat("state '", name, "' is already registered"));
    }
    if (PathPrefix(other, name) || PathPrefix(name, other)) {
      return absl::InvalidArgumentError(absl::StrCat("state '", name, "' overlaps '", other,
                                                     "': one name is a prefix of the other"));
    }
  }
  objects_.emplace_back(std::move(name), object);
  return absl::OkStatus();
}

absl::Status StateRegistry::SaveAll(StateWriter& writer) const {
  for (const auto& [name, object] : objects_) {
    PrefixWriter w(name + "/", writer);
    if (absl::Status st = object->Save(w); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("saving '", name, "': ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status StateRegistry::LoadAll(const StateReader& reader) const {
  for (const auto& [name, object] : objects_) {
    if (reader.Keys(name + "/").empty()) {
      return absl::NotFoundError(absl::StrCat("the checkpoint has no state for '", name,
                                              "' (no key under '", name, "/')"));
    }
  }
  for (const auto& [name, object] : objects_) {
    PrefixReader r(name + "/", reader);
    if (absl::Status st = object->Load(r); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("loading '", name, "': ", st.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeState(const StateRegistry& state) {
  ckpt::StateSnapshot snap;
  if (absl::Status st = snap.Capture(state); !st.ok()) return st;
  return ckpt::EncodeState(snap.items());
}

absl::Status DeserializeState(std::string_view bytes, const StateRegistry& state) {
  absl::StatusOr<std::vector<ckpt::StateItem>> items = ckpt::DecodeState(bytes);
  if (!items.ok()) return items.status();
  return state.LoadAll(ckpt::ItemReader(*items, "the received state"));
}

absl::Status BytesState::Save(StateWriter& writer) const {
  return writer.PutBytes(key_, std::string_view(static_cast<const char*>(data_), size_));
}

absl::Status BytesState::Load(const StateReader& reader) {
  absl::StatusOr<StateReader::Info> info = reader.Find(key_);
  if (!info.ok()) return info.status();
  if (info->dtype != DType::kU8 || info->nbytes != size_) {
    return absl::InvalidArgumentError(absl::StrCat(key_, ": the checkpoint holds ", info->nbytes,
                                                   " bytes of ", DTypeName(info->dtype),
                                                   ", this object has ", size_, " bytes"));
  }
  return reader.ReadTensor(key_, DType::kU8, {static_cast<int64_t>(size_)}, data_, size_);
}

}  // namespace omni
