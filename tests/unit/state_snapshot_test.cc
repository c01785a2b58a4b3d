// The one state serializer (src/ckpt/state_snapshot.h): the capture that
// an asynchronous checkpoint writes later and the elastic group sends, and
// the state transfer's buffer format.
#include "ckpt/state_snapshot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "omni/state.h"

namespace omni::ckpt {
namespace {

// A model-like object: a float tensor, a 2-D int64 tensor, a blob and an
// empty tensor.
class Model final : public Stateful {
 public:
  explicit Model(float fill) : w(1000, fill), idx(6, static_cast<int64_t>(fill)), blob("cfg") {}
  absl::Status Save(StateWriter& out) const override {
    if (auto st = out.PutTensor("w", DType::kF32, {1000}, w.data(), w.size() * 4); !st.ok()) {
      return st;
    }
    if (auto st = out.PutTensor("idx", DType::kI64, {2, 3}, idx.data(), 48); !st.ok()) return st;
    if (auto st = out.PutTensor("empty", DType::kF64, {0}, nullptr, 0); !st.ok()) return st;
    return out.PutBytes("blob", blob);
  }
  absl::Status Load(const StateReader& in) override {
    if (auto st = in.ReadTensor("w", DType::kF32, {1000}, w.data(), w.size() * 4); !st.ok()) {
      return st;
    }
    if (auto st = in.ReadTensor("idx", DType::kI64, {2, 3}, idx.data(), 48); !st.ok()) return st;
    absl::StatusOr<std::string> b = in.ReadBytes("blob");
    if (!b.ok()) return b.status();
    blob = *b;
    return absl::OkStatus();
  }
  std::vector<float> w;
  std::vector<int64_t> idx;
  std::string blob;
};

// Saves one key twice.
class Twice final : public Stateful {
 public:
  absl::Status Save(StateWriter& out) const override {
    const int32_t v = 1;
    if (auto st = out.PutTensor("x", DType::kI32, {1}, &v, 4); !st.ok()) return st;
    return out.PutTensor("x", DType::kI32, {1}, &v, 4);
  }
  absl::Status Load(const StateReader& /*in*/) override { return absl::OkStatus(); }
};

// A Model registered as "model".
struct ModelState {
  explicit ModelState(float fill) : model(fill) {
    EXPECT_TRUE(registry.Register("model", &model).ok());
  }
  Model model;
  StateRegistry registry;
};

bool Inside(const char* p, const HostBlock& b) { return p >= b.data() && p < b.data() + b.size(); }

TEST(StateSnapshot, CapturesEveryTensorAndTheCopyOutlivesChangesToTheSource) {
  ModelState m(1.5f);
  StateSnapshot snap;
  ASSERT_TRUE(snap.Capture(m.registry).ok());
  m.model.w.assign(1000, -1.0f);
  ASSERT_EQ(snap.items().size(), 4u);
  const StateItem& w = snap.items()[0];
  EXPECT_EQ(w.key, "model/w");
  EXPECT_EQ(w.dtype, DType::kF32);
  EXPECT_EQ(w.shape, std::vector<int64_t>{1000});
  ASSERT_EQ(w.nbytes, 4000u);
  float back[1000];
  std::memcpy(back, w.data, sizeof(back));
  EXPECT_EQ(back[0], 1.5f);
  EXPECT_EQ(back[999], 1.5f);
  EXPECT_EQ(snap.items()[2].key, "model/empty");
  EXPECT_EQ(snap.items()[2].nbytes, 0u);
  EXPECT_EQ(snap.bytes(), 4000u + 48u + 3u);
}

TEST(StateSnapshot, ItemsArePacked64ByteAlignedIntoOneBlock) {
  ModelState m(2.0f);
  StateSnapshot snap;
  ASSERT_TRUE(snap.Capture(m.registry).ok());
  for (const StateItem& it : snap.items()) {
    if (it.nbytes == 0) continue;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(it.data) % 64, 0u) << it.key;
  }
  const std::vector<HostBlock> blocks = snap.TakeBlocks();
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(blocks[0].data()) % HostBlock::kAlign, 0u);
  EXPECT_GE(blocks[0].size(), size_t{64} << 20);
}

TEST(StateSnapshot, APooledBlockIsFilledInsteadOfANewMapping) {
  absl::StatusOr<HostBlock> block = HostBlock::Map(size_t{64} << 20);
  ASSERT_TRUE(block.ok()) << block.status();
  const char* pooled = block->data();
  std::vector<HostBlock> pool;
  pool.push_back(*std::move(block));
  ModelState m(3.0f);
  StateSnapshot snap(std::move(pool));
  ASSERT_TRUE(snap.Capture(m.registry).ok());
  for (const StateItem& it : snap.items()) {
    if (it.nbytes == 0) continue;
    EXPECT_TRUE(it.data >= pooled && it.data < pooled + (size_t{64} << 20)) << it.key;
  }
  const std::vector<HostBlock> back = snap.TakeBlocks();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(Inside(pooled, back[0]));
}

TEST(StateSnapshot, UnusedPoolBlocksComeBackWithTheBlocks) {
  std::vector<HostBlock> pool;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<HostBlock> b = HostBlock::Map(size_t{64} << 20);
    ASSERT_TRUE(b.ok()) << b.status();
    pool.push_back(*std::move(b));
  }
  ModelState m(1.0f);
  StateSnapshot snap(std::move(pool));
  ASSERT_TRUE(snap.Capture(m.registry).ok());
  EXPECT_EQ(snap.TakeBlocks().size(), 2u);
}

TEST(StateSnapshot, MoreThanTheLimitIsResourceExhaustedAndSaysSo) {
  ModelState m(1.0f);
  StateSnapshot snap;
  const absl::Status st = snap.Capture(m.registry, /*max_bytes=*/4000 + 47);
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_TRUE(snap.over_limit());
  StateSnapshot fits;
  EXPECT_TRUE(fits.Capture(m.registry, 4000 + 48 + 3).ok());
  EXPECT_FALSE(fits.over_limit());
}

TEST(StateSnapshot, ADuplicateKeyIsRefusedNamingIt) {
  Twice t;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("t", &t).ok());
  StateSnapshot snap;
  const absl::Status st = snap.Capture(reg);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "duplicate key 't/x'")) << st;
  EXPECT_FALSE(snap.over_limit());
}

TEST(StateSnapshot, TheCaptureLoadsBackThroughAnItemReader) {
  ModelState a(4.0f);
  a.model.blob = "state of a";
  StateSnapshot snap;
  ASSERT_TRUE(snap.Capture(a.registry).ok());
  ModelState b(0.0f);
  ASSERT_TRUE(b.registry.LoadAll(ItemReader(snap.items(), "the snapshot")).ok());
  EXPECT_EQ(b.model.w, a.model.w);
  EXPECT_EQ(b.model.idx, a.model.idx);
  EXPECT_EQ(b.model.blob, "state of a");
}

// The transfer buffer, built field by field as the format documents it.
template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

TEST(StateBuffer, TheEncodingIsTheDocumentedLayout) {
  const int32_t values[2] = {7, -7};
  const std::vector<StateItem> items = {
      {"a/v", DType::kI32, {2}, reinterpret_cast<const char*>(values), 8}};
  std::string want("OMNIST01", 8);
  Put(want, uint64_t{1});
  Put(want, uint32_t{3});
  want += "a/v";
  Put(want, static_cast<uint8_t>(DType::kI32));
  Put(want, uint32_t{1});
  Put(want, int64_t{2});
  Put(want, uint64_t{8});
  want.append(reinterpret_cast<const char*>(values), 8);
  EXPECT_EQ(EncodeState(items), want);
}

TEST(StateBuffer, DecodeGivesBackEveryItemPointingIntoTheBuffer) {
  ModelState m(5.0f);
  StateSnapshot snap;
  ASSERT_TRUE(snap.Capture(m.registry).ok());
  const std::string buf = EncodeState(snap.items());
  absl::StatusOr<std::vector<StateItem>> items = DecodeState(buf);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), snap.items().size());
  for (size_t i = 0; i < items->size(); ++i) {
    const StateItem& got = (*items)[i];
    const StateItem& sent = snap.items()[i];
    EXPECT_EQ(got.key, sent.key);
    EXPECT_EQ(got.dtype, sent.dtype);
    EXPECT_EQ(got.shape, sent.shape);
    ASSERT_EQ(got.nbytes, sent.nbytes);
    EXPECT_TRUE(got.data >= buf.data() && got.data + got.nbytes <= buf.data() + buf.size());
    EXPECT_EQ(std::memcmp(got.data, sent.data, got.nbytes), 0) << got.key;
  }
}

TEST(StateBuffer, DecodeRefusesTruncatedMalformedAndPaddedBuffers) {
  const int32_t v = 1;
  const std::string good =
      EncodeState({{"k", DType::kI32, {1}, reinterpret_cast<const char*>(&v), 4}});
  ASSERT_TRUE(DecodeState(good).ok());
  for (size_t cut : {size_t{3}, size_t{16}, size_t{20}, good.size() - 1}) {
    const absl::Status st = DecodeState(std::string_view(good).substr(0, cut)).status();
    EXPECT_TRUE(absl::IsDataLoss(st)) << cut << ": " << st;
  }
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_TRUE(absl::StrContains(DecodeState(bad_magic).status().message(), "bad magic"));
  EXPECT_TRUE(absl::StrContains(DecodeState(good + "x").status().message(), "trailing bytes"));
  std::string bad_dtype = good;
  bad_dtype[8 + 8 + 4 + 1] = 99;  // after magic, count, key length, key
  EXPECT_TRUE(
      absl::StrContains(DecodeState(bad_dtype).status().message(), "bad header of key 'k'"));
}

TEST(StateBuffer, DecodeRefusesARepeatedKey) {
  const int32_t v = 1;
  const StateItem item{"k", DType::kI32, {1}, reinterpret_cast<const char*>(&v), 4};
  const absl::Status st = DecodeState(EncodeState({item, item})).status();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "key 'k' repeated")) << st;
}

TEST(ItemReader, NamesTheSourceOfAMissingKeyAndTheDtypesOfAMismatch) {
  const int32_t v = 1;
  const std::vector<StateItem> items = {
      {"k", DType::kI32, {1}, reinterpret_cast<const char*>(&v), 4}};
  const ItemReader r(items, "the received state");
  const absl::Status missing = r.Find("nope").status();
  EXPECT_TRUE(absl::IsNotFound(missing));
  EXPECT_EQ(missing.message(), "state key 'nope' missing from the received state");
  float f = 0;
  const absl::Status other = r.ReadTensor("k", DType::kF32, {1}, &f, 4);
  EXPECT_TRUE(absl::IsInvalidArgument(other));
  EXPECT_TRUE(absl::StrContains(other.message(), "received I32 of 4 bytes, expected F32")) << other;
  EXPECT_EQ(r.Keys(""), std::vector<std::string>{"k"});
  EXPECT_TRUE(r.Keys("x").empty());
}

}  // namespace
}  // namespace omni::ckpt
