// The communicator contract on the NCCL backend. Without a CUDA device (CI)
// only the error path runs: CreateCommunicator("nccl") must return
// FailedPrecondition naming the CUDA error, never crash or hang. With
// devices (tests/gpu/run.sh on a GPU host) every check runs in forked
// processes, one per GPU, because CUDA does not survive fork(): this test
// process itself never touches CUDA (fork_ranks.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/staging.h"
#include "fork_ranks.h"
#include "omni/comm.h"
#include "omni/config.h"
#include "omni/nccl.h"
#include "omni/store.h"

#if OMNI_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace omni {
namespace {

using test_util::DeviceCount;
using test_util::Fork;
using test_util::kSkipCode;
using test_util::Outcome;

CommOptions Options(int rank, int size, Store* store, absl::Duration init_timeout) {
  CommOptions o;
  o.backend = "nccl";
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.init_timeout = init_timeout;
  return o;
}

TEST(CommNcclNoGpu, CreateIsFailedPreconditionNamingTheCudaError) {
  const std::vector<Outcome> out = Fork(1, [](int rank, Store& store) -> std::string {
    if (OMNI_HAVE_NCCL && ProbeNccl().ok()) return "skip: a CUDA device is present";
    const absl::Time start = absl::Now();
    // size 2: a rank that failed to find a GPU must not wait for its peer.
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(1, 2, &store, absl::Seconds(30)));
    const absl::Duration took = absl::Now() - start;
    if (!OMNI_HAVE_NCCL) {
      RANK_CHECK(c.status().code() == absl::StatusCode::kUnimplemented, c.status().ToString());
      return "";
    }
    RANK_CHECK(c.status().code() == absl::StatusCode::kFailedPrecondition, c.status().ToString());
    RANK_CHECK(c.status().message().find("cudaError") != absl::string_view::npos,
               c.status().ToString());
    RANK_CHECK(took < absl::Seconds(5), absl::FormatDuration(took));
    std::cout << "[   info   ] " << c.status() << "\n";
    return "";
  });
  if (out[0].code == kSkipCode) GTEST_SKIP() << out[0].message;
  EXPECT_EQ(out[0].code, 0) << out[0].message;
}

#if OMNI_HAVE_NCCL

using test_util::DeviceVector;

// AllReduce (sum, avg, min, max; float32 and int64), Broadcast from the last
// rank, AllGather and Barrier on `c`, checked on the host.
std::string CheckCollectives(Communicator& c) {
  const int rank = c.rank();
  const int n = c.size();
  constexpr size_t kCount = 1 << 16;
  const absl::Duration t = absl::Seconds(30);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    DeviceVector<float> f(std::vector<float>(kCount, static_cast<float>(rank + 1)));
    DeviceVector<int64_t> i(std::vector<int64_t>(kCount, rank + 1));
    absl::Status s = c.AllReduce(f.get(), kCount, DType::kF32, op, t);
    RANK_CHECK(s.ok(), s.ToString());
    s = c.AllReduce(i.get(), kCount, DType::kI64, op, t);
    RANK_CHECK(s.ok(), s.ToString());
    const int64_t sum = static_cast<int64_t>(n) * (n + 1) / 2;
    const int64_t want = op == ReduceOp::kSum   ? sum
                         : op == ReduceOp::kAvg ? sum / n
                         : op == ReduceOp::kMin ? 1
                                                : n;
    const float want_f = op == ReduceOp::kAvg ? static_cast<float>(sum) / static_cast<float>(n)
                                              : static_cast<float>(want);
    const std::vector<float> hf = f.Host();
    const std::vector<int64_t> hi = i.Host();
    RANK_CHECK(std::abs(hf[0] - want_f) < 1e-5f && std::abs(hf[kCount - 1] - want_f) < 1e-5f,
               ReduceOpName(op), " float32 ", hf[0], " want ", want_f);
    RANK_CHECK(hi[0] == want && hi[kCount - 1] == want, ReduceOpName(op), " int64 ", hi[0],
               " want ", want);
  }
  DeviceVector<uint8_t> b(std::vector<uint8_t>(4096, static_cast<uint8_t>(rank == n - 1 ? 42 : 0)));
  absl::Status s = c.Broadcast(b.get(), 4096, n - 1, t);
  RANK_CHECK(s.ok(), s.ToString());
  RANK_CHECK(b.Host()[4095] == 42, "broadcast");
  DeviceVector<uint8_t> in(std::vector<uint8_t>(8, static_cast<uint8_t>(rank)));
  DeviceVector<uint8_t> out(std::vector<uint8_t>(8 * static_cast<size_t>(n), 0xff));
  s = c.AllGather(in.get(), 8, out.get(), t);
  RANK_CHECK(s.ok(), s.ToString());
  const std::vector<uint8_t> g = out.Host();
  for (int r = 0; r < n; ++r) RANK_CHECK(g[8 * r + 7] == r, "allgather slot ", r);
  s = c.Barrier(t);
  RANK_CHECK(s.ok(), s.ToString());
  return "";
}

// The collectives on host memory, which the communicator stages through its
// device buffer (src/comm/staging.h): pageable buffers larger than the
// staging buffer (several chunks each; an offset error would scramble
// them), pinned memory, and an AllGather from device to host memory.
std::string CheckHostCollectives(Communicator& c) {
  const int rank = c.rank();
  const int n = c.size();
  const absl::Duration t = absl::Seconds(60);
  const size_t per_chunk = internal::kStageBytes / sizeof(int64_t);
  const size_t count = per_chunk + 1000;
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<int64_t>(i) * n + rank;
  absl::Status s = c.AllReduce(v.data(), count, DType::kI64, ReduceOp::kSum, t);
  RANK_CHECK(s.ok(), s.ToString());
  for (size_t i : {size_t{0}, per_chunk - 1, per_chunk, count - 1}) {
    const int64_t want = static_cast<int64_t>(i) * n * n + static_cast<int64_t>(n) * (n - 1) / 2;
    RANK_CHECK(v[i] == want, "staged AllReduce element ", i, ": ", v[i], " want ", want);
  }

  const size_t bytes = internal::kStageBytes + 17;
  std::vector<uint8_t> b(bytes, 0);
  if (rank == n - 1) {
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(i * 7);
  }
  s = c.Broadcast(b.data(), bytes, n - 1, t);
  RANK_CHECK(s.ok(), s.ToString());
  for (size_t i : {size_t{1}, internal::kStageBytes - 1, internal::kStageBytes, bytes - 1}) {
    RANK_CHECK(b[i] == static_cast<uint8_t>(i * 7), "staged Broadcast byte ", i);
  }

  const size_t piece = internal::GatherPieceBytes(internal::kStageBytes, n) + 5;
  std::vector<uint8_t> in(piece);
  for (size_t i = 0; i < piece; ++i) in[i] = static_cast<uint8_t>(i + static_cast<size_t>(rank));
  std::vector<uint8_t> out(piece * static_cast<size_t>(n), 0xff);
  s = c.AllGather(in.data(), piece, out.data(), t);
  RANK_CHECK(s.ok(), s.ToString());
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    for (size_t i : {size_t{0}, piece - 6, piece - 5, piece - 1}) {
      RANK_CHECK(out[r * piece + i] == static_cast<uint8_t>(i + r), "staged AllGather rank ", r,
                 " byte ", i);
    }
  }

  void* pinned = nullptr;
  RANK_CHECK(cudaMallocHost(&pinned, 64 * sizeof(int32_t)) == cudaSuccess, "cudaMallocHost");
  std::unique_ptr<void, decltype(&cudaFreeHost)> pinned_owner(pinned, &cudaFreeHost);
  auto* p = static_cast<int32_t*>(pinned);
  std::fill(p, p + 64, rank + 1);
  s = c.AllReduce(p, 64, DType::kI32, ReduceOp::kMax, t);
  RANK_CHECK(s.ok(), s.ToString());
  RANK_CHECK(p[0] == n && p[63] == n, "pinned AllReduce max ", p[0], " want ", n);

  DeviceVector<uint8_t> dev_in(std::vector<uint8_t>(8, static_cast<uint8_t>(rank + 1)));
  std::vector<uint8_t> host_out(8 * static_cast<size_t>(n), 0);
  s = c.AllGather(dev_in.get(), 8, host_out.data(), t);
  RANK_CHECK(s.ok(), s.ToString());
  for (int r = 0; r < n; ++r) {
    RANK_CHECK(host_out[8 * static_cast<size_t>(r) + 7] == r + 1, "device-to-host AllGather ", r);
  }
  return "";
}

class CommNcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    devices_ = DeviceCount();
    if (devices_ == 0) GTEST_SKIP() << "no CUDA device: only the no-GPU error path runs here";
  }
  int devices_ = 0;
};

TEST_F(CommNcclGpu, SingleGpuCollectivesOnDeviceAndHostMemoryAbortAndReinit) {
  const std::vector<Outcome> out = Fork(1, [](int rank, Store& store) -> std::string {
    std::unique_ptr<Store> gen1 = MakePrefixStore(store, "gen1");
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(0, 1, gen1.get(), absl::Seconds(60)));
    RANK_CHECK(c.ok(), c.status().ToString());
    std::string e = CheckCollectives(**c);
    RANK_CHECK(e.empty(), e);
    e = CheckHostCollectives(**c);
    RANK_CHECK(e.empty(), e);
    // Abort: every later call fails fast with Aborted.
    (*c)->Abort();
    (*c)->Abort();
    DeviceVector<float> f(std::vector<float>(16, 1.0f));
    const absl::Status s =
        (*c)->AllReduce(f.get(), 16, DType::kF32, ReduceOp::kSum, absl::Seconds(5));
    RANK_CHECK(s.code() == absl::StatusCode::kAborted, s.ToString());
    RANK_CHECK((*c)->AsyncError().code() == absl::StatusCode::kAborted, "AsyncError");
    c->reset();
    // Re-init after abort: a new communicator on a fresh store view works.
    std::unique_ptr<Store> gen2 = MakePrefixStore(store, "gen2");
    absl::StatusOr<std::unique_ptr<Communicator>> again =
        CreateCommunicator(Options(0, 1, gen2.get(), absl::Seconds(60)));
    RANK_CHECK(again.ok(), again.status().ToString());
    e = CheckCollectives(**again);
    RANK_CHECK(e.empty(), e);
    return "";
  });
  EXPECT_EQ(out[0].code, 0) << out[0].message;
}

TEST_F(CommNcclGpu, InitWithAPeerThatNeverInitializesTimesOut) {
  // Rank 1 "arrives" in the store but never calls NCCL: rank 0's
  // non-blocking init must give up at init_timeout, not hang.
  const std::vector<Outcome> out = Fork(1, [](int rank, Store& store) -> std::string {
    RANK_CHECK(store.Set("arrive/1", "1").ok(), "set");
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(0, 2, &store, absl::Seconds(3)));
    const absl::Duration took = absl::Now() - start;
    RANK_CHECK(c.status().code() == absl::StatusCode::kDeadlineExceeded, c.status().ToString());
    RANK_CHECK(took < absl::Seconds(3 + 10), absl::FormatDuration(took));
    std::cout << "[   info   ] init gave up after " << took << ": " << c.status() << "\n";
    return "";
  });
  EXPECT_EQ(out[0].code, 0) << out[0].message;
}

TEST_F(CommNcclGpu, MultiGpuCollectivesOneProcessPerGpu) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices_;
  const int n = std::min(devices_, 8);
  const std::vector<Outcome> out = Fork(n, [n](int rank, Store& store) -> std::string {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(rank, n, &store, absl::Seconds(60)));
    RANK_CHECK(c.ok(), c.status().ToString());
    std::string e = CheckCollectives(**c);
    RANK_CHECK(e.empty(), e);
    e = CheckHostCollectives(**c);
    RANK_CHECK(e.empty(), e);
    return "";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r].code, 0) << out[r].message;
}

TEST_F(CommNcclGpu, MemoryOfAnotherDeviceIsRefusedWithoutBreakingTheCommunicator) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices_;
  const std::vector<Outcome> out = Fork(1, [](int rank, Store& store) -> std::string {
    CommOptions o = Options(0, 1, &store, absl::Seconds(60));
    o.device = 0;
    absl::StatusOr<std::unique_ptr<Communicator>> c = CreateCommunicator(o);
    RANK_CHECK(c.ok(), c.status().ToString());
    RANK_CHECK(cudaSetDevice(1) == cudaSuccess, "cudaSetDevice(1)");
    DeviceVector<float> elsewhere(std::vector<float>(16, 1.0f));
    RANK_CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice(0)");
    const absl::Status s =
        (*c)->AllReduce(elsewhere.get(), 16, DType::kF32, ReduceOp::kSum, absl::Seconds(5));
    RANK_CHECK(s.code() == absl::StatusCode::kInvalidArgument, s.ToString());
    RANK_CHECK(s.message().find("device 1") != absl::string_view::npos, s.ToString());
    RANK_CHECK((*c)->AsyncError().ok(), (*c)->AsyncError().ToString());
    const std::string e = CheckCollectives(**c);
    RANK_CHECK(e.empty(), e);
    return "";
  });
  EXPECT_EQ(out[0].code, 0) << out[0].message;
}

TEST_F(CommNcclGpu, MultiGpuAbortFromAnotherThreadUnblocksAllReduce) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices_;
  const std::vector<Outcome> out = Fork(2, [](int rank, Store& store) -> std::string {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(rank, 2, &store, absl::Seconds(60)));
    RANK_CHECK(c.ok(), c.status().ToString());
    if (rank == 1) {  // never joins; leaves once rank 0 is done
      RANK_CHECK(store.Get("done", absl::Seconds(60)).ok(), "rank 0 never finished");
      (*c)->Abort();
      return "";
    }
    DeviceVector<float> f(std::vector<float>(1 << 20, 1.0f));
    absl::Status s;
    std::thread caller([&] {
      s = (*c)->AllReduce(f.get(), 1 << 20, DType::kF32, ReduceOp::kSum, absl::Seconds(60));
    });
    absl::SleepFor(absl::Milliseconds(500));
    const absl::Time start = absl::Now();
    (*c)->Abort();
    caller.join();
    const absl::Duration took = absl::Now() - start;
    const bool stored = store.Set("done", "1").ok();
    RANK_CHECK(stored, "set");
    RANK_CHECK(s.code() == absl::StatusCode::kAborted, s.ToString());
    RANK_CHECK(took < absl::Seconds(5), absl::FormatDuration(took));
    std::cout << "[   info   ] blocked AllReduce returned " << took << " after Abort()\n";
    return "";
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r].code, 0) << out[r].message;
}

TEST_F(CommNcclGpu, MultiGpuShrinkDropsTheLastRankOrIsUnimplemented) {
  if (devices_ < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices_;
  const int n = std::min(devices_, 4);
  const std::vector<Outcome> out = Fork(n, [n](int rank, Store& store) -> std::string {
    absl::StatusOr<std::unique_ptr<Communicator>> c =
        CreateCommunicator(Options(rank, n, &store, absl::Seconds(60)));
    RANK_CHECK(c.ok(), c.status().ToString());
    if (rank == n - 1) {  // the excluded rank does not call Shrink
      RANK_CHECK(store.Wait({"shrunk/0"}, absl::Seconds(60)).ok(), "rank 0 never finished");
      (*c)->Abort();
      return "";
    }
    absl::StatusOr<std::unique_ptr<Communicator>> small = (*c)->Shrink({n - 1}, absl::Seconds(60));
    if (small.status().code() == absl::StatusCode::kUnimplemented) {
      if (rank == 0) RANK_CHECK(store.Set("shrunk/0", "1").ok(), "set");
      RANK_CHECK(NcclLibraryVersion() < 22700, small.status().ToString());
      return "";
    }
    RANK_CHECK(small.ok(), small.status().ToString());
    RANK_CHECK((*small)->rank() == rank && (*small)->size() == n - 1, "renumbering");
    const std::string e = CheckCollectives(**small);
    if (rank == 0) RANK_CHECK(store.Set("shrunk/0", "1").ok(), "set");
    RANK_CHECK(e.empty(), e);
    return "";
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r].code, 0) << out[r].message;
}

#endif  // OMNI_HAVE_NCCL

}  // namespace
}  // namespace omni
