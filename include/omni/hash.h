// XXH3-64 hashing, used for model digests and checkpoint checksums. Where the
// xxhash library has its x86 dispatcher, the widest vector unit of the host
// (SSE2, AVX2, AVX-512) is used; the digests are the same on every path.
//
// Thread safety: a Xxh3 object is not thread-safe; distinct objects are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "omni/export.h"

namespace omni {

// Streaming XXH3-64 (seed 0). Digest() may be called at any time and does not
// end the stream.
class OMNI_EXPORT Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot XXH3-64 of a buffer.
OMNI_EXPORT uint64_t Xxh3Of(const void* data, size_t size);

// 16 lowercase hex digits, zero-padded.
OMNI_EXPORT std::string HexDigest(uint64_t digest);

}  // namespace omni
