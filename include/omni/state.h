// The training state as a keyed registry of stateful objects, so that a
// checkpoint describes itself: every object saves tensors (raw little-endian
// bytes with a dtype and shape) and byte blobs under its own key prefix
// ("model/", "optim/", "rng/torch_cpu/", "data/", ...).
//
// Thread safety: a StateRegistry is used by one thread at a time; Stateful
// objects are called from the thread that calls Save / Restore.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "omni/export.h"

namespace omni {

// Element types, named as in the safetensors format.
enum class DType : uint8_t { kBool, kU8, kI8, kI16, kI32, kI64, kF16, kBF16, kF32, kF64 };

// "BOOL", "U8", "I8", "I16", "I32", "I64", "F16", "BF16", "F32", "F64".
OMNI_EXPORT const char* DTypeName(DType dtype);
OMNI_EXPORT absl::StatusOr<DType> ParseDType(std::string_view name);
OMNI_EXPORT size_t DTypeSize(DType dtype);

// Number of bytes of a tensor of `shape` (InvalidArgument for a negative
// dimension or an overflow).
OMNI_EXPORT absl::StatusOr<size_t> TensorBytes(DType dtype, const std::vector<int64_t>& shape);

// True for a well-formed key: 1 to 512 characters of [A-Za-z0-9_.-/], no
// leading, trailing or doubled '/', no "." or ".." component.
OMNI_EXPORT bool IsValidStateKey(std::string_view key);

// Receives the state of one object. Keys are relative to the object's prefix
// (see IsValidStateKey). The bytes are consumed (written to the checkpoint
// file, or copied) before PutTensor / PutBytes returns, so callers may pass
// their live memory or a temporary that dies right after the call.
class OMNI_EXPORT StateWriter {
 public:
  virtual ~StateWriter() = default;
  // InvalidArgument naming the key for a duplicate or malformed key, or when
  // nbytes != TensorBytes(dtype, shape). Other errors (e.g. ResourceExhausted
  // for a full disk) name the file being written.
  virtual absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                                 const void* data, size_t nbytes) = 0;
  // Non-tensor state (serialized by the object), stored as a 1-D U8 tensor.
  virtual absl::Status PutBytes(std::string_view key, std::string_view bytes) = 0;
};

// Reads the state of one object back. Errors name the key and the checkpoint
// file: NotFound for a missing key, InvalidArgument for a dtype or shape that
// differs from what the caller expects (a model with other shapes).
class OMNI_EXPORT StateReader {
 public:
  struct Info {
    DType dtype = DType::kU8;
    std::vector<int64_t> shape;
    size_t nbytes = 0;
  };
  virtual ~StateReader() = default;
  // NotFound naming the key and file when absent.
  virtual absl::StatusOr<Info> Find(std::string_view key) const = 0;
  // Copies the tensor into `dst` (the caller's existing memory, `nbytes`
  // long). Checks dtype, shape and nbytes before writing to `dst`; DataLoss
  // when the bytes read do not match their checksum.
  virtual absl::Status ReadTensor(std::string_view key, DType dtype,
                                  const std::vector<int64_t>& shape, void* dst,
                                  size_t nbytes) const = 0;
  // A blob stored by StateWriter::PutBytes (InvalidArgument for a tensor that
  // is not 1-D U8).
  virtual absl::StatusOr<std::string> ReadBytes(std::string_view key) const = 0;
  // Keys (relative) that start with `prefix`, sorted.
  virtual std::vector<std::string> Keys(std::string_view prefix = "") const = 0;
};

class OMNI_EXPORT Stateful {
 public:
  virtual ~Stateful() = default;
  // Writes the object's state. An object must save at least one key, or it
  // cannot be restored (StateRegistry::LoadAll reports it as missing).
  virtual absl::Status Save(StateWriter& writer) const = 0;
  // Should not change the object unless it returns OK: check the keys, dtypes
  // and shapes it needs (Find) before overwriting anything. The checkpoint
  // layer checks the shard's size and header before any Load and each
  // tensor's checksum as it is read: ReadTensor may return DataLoss, which
  // Load should return (the restore then loads every object again from the
  // previous valid checkpoint, so a partial load never survives).
  virtual absl::Status Load(const StateReader& reader) = 0;
};

// Objects by name (the key prefix, e.g. "model", "optim", "rng/torch_cpu").
class OMNI_EXPORT StateRegistry {
 public:
  // The object is not owned and must outlive the registry's use. The name is
  // a key (IsValidStateKey) and must not be a path prefix of another name
  // ("rng" and "rng/cuda" would share keys). AlreadyExists /
  // InvalidArgument naming the name.
  absl::Status Register(std::string name, Stateful* object);
  // Calls every object's Save, in registration order, with a writer that
  // prefixes "name/". Errors are prefixed with the object's name.
  absl::Status SaveAll(StateWriter& writer) const;
  // Calls every object's Load with a reader restricted to "name/". First
  // checks that the checkpoint has keys for every object (NotFound naming
  // the object otherwise), so a missing object never leaves a partial load.
  absl::Status LoadAll(const StateReader& reader) const;
  const std::vector<std::pair<std::string, Stateful*>>& objects() const { return objects_; }

 private:
  std::vector<std::pair<std::string, Stateful*>> objects_;
};

// A Stateful over plain memory the caller owns (e.g. counters, a std::mt19937
// serialized by the caller), for small things that need no class of their own.
// Saved as one U8 tensor under `key`; Load refuses a blob of another size
// (InvalidArgument naming the key) without touching the memory.
class OMNI_EXPORT BytesState final : public Stateful {
 public:
  BytesState(std::string key, void* data, size_t size)
      : key_(std::move(key)), data_(data), size_(size) {}
  absl::Status Save(StateWriter& writer) const override;
  absl::Status Load(const StateReader& reader) override;

 private:
  std::string key_;
  void* data_;
  size_t size_;
};

// The state as one buffer, the format in which the elastic group hands it
// to a replica that lacks it: every object's tensors and blobs with their
// keys, dtypes and shapes (the same capture as an asynchronous checkpoint's
// snapshot). Errors: the objects' own; InvalidArgument naming the key for a
// malformed or duplicate key or a size that does not match its dtype and
// shape.
OMNI_EXPORT absl::StatusOr<std::string> SerializeState(const StateRegistry& state);
// Loads a buffer made by SerializeState into `state` (which must have the
// same objects). DataLoss for a truncated or malformed buffer, before any
// object is loaded; the objects' own errors (other shapes, missing keys)
// name the key.
OMNI_EXPORT absl::Status DeserializeState(std::string_view bytes, const StateRegistry& state);

}  // namespace omni
