#include "omni/hash.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#if defined(OMNI_XXH3_DISPATCH)
// Replaces XXH3_64bits{,_update} with the run-time dispatched (AVX2/AVX-512)
// versions; the digests are the same on every path.
#include <xxh_x86dispatch.h>
#endif

#include <cstdio>

namespace omni {

struct Xxh3::State {
  XXH3_state_t s;
};

Xxh3::Xxh3() : state_(std::make_unique<State>()) { XXH3_64bits_reset(&state_->s); }
Xxh3::~Xxh3() = default;

void Xxh3::Update(const void* data, size_t size) {
  if (size > 0) XXH3_64bits_update(&state_->s, data, size);
}

uint64_t Xxh3::Digest() const { return XXH3_64bits_digest(&state_->s); }

uint64_t Xxh3Of(const void* data, size_t size) { return XXH3_64bits(data, size); }

std::string HexDigest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(digest));
  return std::string(buf, 16);
}

}  // namespace omni
