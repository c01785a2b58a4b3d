#include "omni/hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace omni {
namespace {

// A fixed pseudo-random buffer (LCG), the same on every host.
std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> b(n);
  uint32_t x = 12345;
  for (auto& c : b) {
    x = x * 1664525U + 1013904223U;
    c = static_cast<unsigned char>(x >> 24);
  }
  return b;
}

// Known answers from the reference (scalar/SSE2) XXH3-64, seed 0: whatever
// vector path the host dispatches to must give the same digests, or every
// checkpoint written elsewhere would fail its checksums here.
TEST(Xxh3, OneShotDigestsMatchTheReferenceAtEverySize) {
  EXPECT_EQ(Xxh3Of(nullptr, 0), 0x2d06800538d394c2ULL);
  const struct {
    size_t size;
    uint64_t digest;
  } known[] = {{3, 0x5153836bf6da91e2ULL},
               {240, 0xe9b8ecbc23497c67ULL},
               {size_t{1} << 20, 0x6bfc3c9b3909a1b3ULL},
               {(size_t{1} << 20) + 17, 0x8e44ab6ab525444aULL}};
  for (const auto& k : known) {
    const std::vector<unsigned char> b = Pattern(k.size);
    EXPECT_EQ(Xxh3Of(b.data(), b.size()), k.digest) << "size " << k.size;
  }
}

TEST(Xxh3, StreamingInUnevenPiecesEqualsOneShot) {
  const std::vector<unsigned char> b = Pattern((size_t{1} << 20) + 17);
  Xxh3 h;
  size_t at = 0;
  for (size_t piece = 1; at < b.size(); piece = piece * 3 + 1) {
    const size_t n = std::min(piece, b.size() - at);
    h.Update(b.data() + at, n);
    at += n;
  }
  EXPECT_EQ(h.Digest(), 0x8e44ab6ab525444aULL);
  EXPECT_EQ(HexDigest(h.Digest()), "8e44ab6ab525444a");
}

}  // namespace
}  // namespace omni
