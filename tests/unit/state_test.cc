#include "omni/state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace omni {
namespace {

// True when `text` contains `part`; the message shows the text otherwise.
::testing::AssertionResult Contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

// An in-memory writer and reader, to test the registry on its own.
class MemoryState final : public StateWriter, public StateReader {
 public:
  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    if (!IsValidStateKey(key)) return absl::InvalidArgumentError(std::string(key));
    auto [it, fresh] = tensors.emplace(
        std::string(key),
        Tensor{dtype, std::move(shape), std::string(static_cast<const char*>(data), nbytes)});
    if (!fresh) return absl::InvalidArgumentError("duplicate " + std::string(key));
    order.emplace_back(key);
    return absl::OkStatus();
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                     bytes.size());
  }
  absl::StatusOr<Info> Find(std::string_view key) const override {
    auto it = tensors.find(std::string(key));
    if (it == tensors.end()) return absl::NotFoundError("key '" + std::string(key) + "'");
    return Info{it->second.dtype, it->second.shape, it->second.bytes.size()};
  }
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override {
    auto it = tensors.find(std::string(key));
    if (it == tensors.end()) return absl::NotFoundError("key '" + std::string(key) + "'");
    if (it->second.dtype != dtype || it->second.shape != shape ||
        it->second.bytes.size() != nbytes) {
      return absl::InvalidArgumentError("key '" + std::string(key) + "' differs");
    }
    std::memcpy(dst, it->second.bytes.data(), nbytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override {
    auto it = tensors.find(std::string(key));
    if (it == tensors.end()) return absl::NotFoundError(std::string(key));
    return it->second.bytes;
  }
  std::vector<std::string> Keys(std::string_view prefix) const override {
    std::vector<std::string> out;
    for (const auto& [k, t] : tensors) {
      if (k.compare(0, prefix.size(), prefix) == 0) out.push_back(k);
    }
    return out;
  }

  std::map<std::string, Tensor> tensors;
  std::vector<std::string> order;
};

// Saves two fixed keys; records what Load saw.
class Recorder final : public Stateful {
 public:
  explicit Recorder(float value) : value_(value) {}
  absl::Status Save(StateWriter& w) const override {
    if (auto st = w.PutTensor("x", DType::kF32, {}, &value_, sizeof(value_)); !st.ok()) return st;
    return w.PutBytes("tag/name", "rec");
  }
  absl::Status Load(const StateReader& r) override {
    ++loads;
    keys_seen = r.Keys();
    return r.ReadTensor("x", DType::kF32, {}, &value_, sizeof(value_));
  }
  float value() const { return value_; }
  int loads = 0;
  std::vector<std::string> keys_seen;

 private:
  float value_;
};

TEST(StateDType, NamesRoundTripAndSizesFollowSafetensors) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::kBool, 1}, {DType::kU8, 1},  {DType::kI8, 1},   {DType::kI16, 2}, {DType::kI32, 4},
      {DType::kI64, 8},  {DType::kF16, 2}, {DType::kBF16, 2}, {DType::kF32, 4}, {DType::kF64, 8}};
  for (const auto& [dt, size] : all) {
    EXPECT_EQ(DTypeSize(dt), size) << DTypeName(dt);
    auto parsed = ParseDType(DTypeName(dt));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dt);
  }
  EXPECT_STREQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_STREQ(DTypeName(DType::kBool), "BOOL");
}

TEST(StateDType, ParseRejectsUnknownNamesNamingThem) {
  auto st = ParseDType("F8_E4M3");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(std::string(st.status().message()), "F8_E4M3"));
  EXPECT_FALSE(ParseDType("f32").ok());
}

TEST(StateTensorBytes, MultipliesShapeByElementSize) {
  EXPECT_EQ(*TensorBytes(DType::kF32, {3, 4}), 48u);
  EXPECT_EQ(*TensorBytes(DType::kI64, {}), 8u);  // a scalar is one element
  EXPECT_EQ(*TensorBytes(DType::kF16, {0, 7}), 0u);
}

TEST(StateTensorBytes, RejectsNegativeDimensionsAndOverflow) {
  EXPECT_EQ(TensorBytes(DType::kF32, {2, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(TensorBytes(DType::kF64, {big, big}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StateKeys, AcceptWellFormedPathsOnly) {
  for (const char* ok : {"a", "model/param/layer.0.weight", "rng/cuda/0", "A-b_c.d"}) {
    EXPECT_TRUE(IsValidStateKey(ok)) << ok;
  }
  for (const char* bad :
       {"", "/a", "a/", "a//b", "a/./b", "../x", "a b", "a:b", "ключ", "__metadata__\n"}) {
    EXPECT_FALSE(IsValidStateKey(bad)) << bad;
  }
  EXPECT_FALSE(IsValidStateKey(std::string(513, 'a')));
}

TEST(StateRegistry, RejectsDuplicateMalformedNullAndOverlappingNames) {
  StateRegistry reg;
  Recorder a(1), b(2);
  ASSERT_TRUE(reg.Register("rng", &a).ok());
  auto dup = reg.Register("rng", &b);
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(std::string(dup.message()), "'rng'"));
  auto overlap = reg.Register("rng/cuda", &b);
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(overlap.message()), "rng/cuda"));
  EXPECT_EQ(reg.Register("bad name", &b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Register("model", nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(reg.Register("rngs", &b).ok());  // not a path prefix of "rng"
  EXPECT_EQ(reg.objects().size(), 2u);
}

TEST(StateRegistry, SaveAllPrefixesKeysWithTheNameInRegistrationOrder) {
  StateRegistry reg;
  Recorder a(1), b(2);
  ASSERT_TRUE(reg.Register("model", &a).ok());
  ASSERT_TRUE(reg.Register("optim", &b).ok());
  MemoryState mem;
  ASSERT_TRUE(reg.SaveAll(mem).ok());
  EXPECT_EQ(mem.order,
            (std::vector<std::string>{"model/x", "model/tag/name", "optim/x", "optim/tag/name"}));
}

TEST(StateRegistry, SaveAllErrorsNameTheObject) {
  StateRegistry reg;
  Recorder a(1);
  ASSERT_TRUE(reg.Register("model", &a).ok());
  MemoryState mem;
  mem.tensors["model/x"] = {DType::kF32, {}, "1234"};  // makes the put a duplicate
  auto st = reg.SaveAll(mem);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(std::string(st.message()), "saving 'model'"));
}

TEST(StateRegistry, LoadAllShowsEachObjectOnlyItsOwnKeys) {
  StateRegistry reg;
  Recorder a(1), b(2);
  ASSERT_TRUE(reg.Register("model", &a).ok());
  ASSERT_TRUE(reg.Register("optim", &b).ok());
  MemoryState mem;
  ASSERT_TRUE(reg.SaveAll(mem).ok());
  Recorder a2(0), b2(0);
  StateRegistry reg2;
  ASSERT_TRUE(reg2.Register("model", &a2).ok());
  ASSERT_TRUE(reg2.Register("optim", &b2).ok());
  ASSERT_TRUE(reg2.LoadAll(mem).ok());
  EXPECT_EQ(a2.value(), 1.0f);
  EXPECT_EQ(b2.value(), 2.0f);
  EXPECT_EQ(a2.keys_seen, (std::vector<std::string>{"tag/name", "x"}));
}

TEST(StateRegistry, LoadAllChecksEveryObjectBeforeLoadingAny) {
  StateRegistry saved;
  Recorder a(1);
  ASSERT_TRUE(saved.Register("model", &a).ok());
  MemoryState mem;
  ASSERT_TRUE(saved.SaveAll(mem).ok());

  StateRegistry reg;
  Recorder a2(0), extra(0);
  ASSERT_TRUE(reg.Register("model", &a2).ok());
  ASSERT_TRUE(reg.Register("sampler", &extra).ok());
  auto st = reg.LoadAll(mem);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(st.message()), "'sampler'"));
  EXPECT_EQ(a2.loads, 0) << "a missing object must fail before any object is loaded";
}

TEST(StateBytes, RoundTripsPlainMemory) {
  struct {
    int64_t step = 41;
    double loss = 0.25;
  } progress, restored{0, 0};
  BytesState s("progress", &progress, sizeof(progress));
  MemoryState mem;
  ASSERT_TRUE(s.Save(mem).ok());
  EXPECT_EQ(mem.tensors["progress"].dtype, DType::kU8);
  BytesState r("progress", &restored, sizeof(restored));
  ASSERT_TRUE(r.Load(mem).ok());
  EXPECT_EQ(restored.step, 41);
  EXPECT_EQ(restored.loss, 0.25);
}

TEST(StateBytes, RefusesABlobOfAnotherSizeWithoutTouchingMemory) {
  int32_t small = 7;
  BytesState s("counter", &small, sizeof(small));
  MemoryState mem;
  ASSERT_TRUE(s.Save(mem).ok());
  int64_t big = -1;
  BytesState r("counter", &big, sizeof(big));
  auto st = r.Load(mem);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(st.message()), "counter"));
  EXPECT_EQ(big, -1);
}

}  // namespace
}  // namespace omni
