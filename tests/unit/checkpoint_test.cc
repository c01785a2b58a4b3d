#include "omni/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "omni/hash.h"
#include "omni/version.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------- helpers

::testing::AssertionResult Contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

using test_util::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::string StepDir(const std::string& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012lld", static_cast<long long>(step));
  return (fs::path(root) / buf).string();
}

std::string Shard(const std::string& root, int64_t step, int rank = 0) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return (fs::path(StepDir(root, step)) / buf).string();
}

// Names under `dir` that a crashed writer could leave behind.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp", 0) == 0 || n.rfind(".trash", 0) == 0 || n.find(".tmp.") != n.npos) {
      out.push_back(n);
    }
  }
  return out;
}

// A model-like state: named float tensors of fixed shapes. Load checks every
// key, dtype and shape before it overwrites anything.
class Tensors final : public Stateful {
 public:
  struct T {
    std::string key;
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  explicit Tensors(std::vector<std::pair<std::string, std::vector<int64_t>>> layout) {
    for (auto& [k, shape] : layout) {
      size_t n = 1;
      for (int64_t d : shape) n *= static_cast<size_t>(d);
      tensors.push_back({k, shape, std::vector<float>(n, 0.0f)});
    }
  }
  void Fill(float base) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (size_t i = 0; i < tensors[t].data.size(); ++i) {
        tensors[t].data[i] = base + static_cast<float>(t) * 1000.0f + static_cast<float>(i) * 0.5f;
      }
    }
  }
  absl::Status Save(StateWriter& w) const override {
    for (const T& t : tensors) {
      if (auto st = w.PutTensor(t.key, DType::kF32, t.shape, t.data.data(),
                                t.data.size() * sizeof(float));
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Load(const StateReader& r) override {
    ++loads;
    for (const T& t : tensors) {
      auto info = r.Find(t.key);
      if (!info.ok()) return info.status();
    }
    for (T& t : tensors) {
      if (auto st = r.ReadTensor(t.key, DType::kF32, t.shape, t.data.data(),
                                 t.data.size() * sizeof(float));
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  bool AllEqual(const Tensors& o) const {
    if (o.tensors.size() != tensors.size()) return false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].data != o.tensors[i].data) return false;
    }
    return true;
  }
  std::vector<T> tensors;
  int loads = 0;
};

// The usual test state: a model with two tensors and a step counter.
struct TestState {
  explicit TestState(std::vector<std::pair<std::string, std::vector<int64_t>>> layout =
                         {{"w", {4, 4}}, {"b", {4}}})
      : model(std::move(layout)), counter("step", &step, sizeof(step)) {
    EXPECT_TRUE(registry.Register("model", &model).ok());
    EXPECT_TRUE(registry.Register("train", &counter).ok());
  }
  void Set(int64_t s) {
    step = s;
    model.Fill(static_cast<float>(s));
  }
  Tensors model;
  int64_t step = 0;
  BytesState counter;
  StateRegistry registry;
};

CheckpointOptions Options(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.job_id = "job-1";
  o.keep_last = 100;
  return o;
}

std::unique_ptr<CheckpointManager> MustOpen(const CheckpointOptions& o) {
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

void MustSave(CheckpointManager& m, TestState& s, int64_t step) {
  s.Set(step);
  auto st = m.Save(step, s.registry, {{"note", "step " + std::to_string(step)}});
  ASSERT_TRUE(st.ok()) << st.status();
}

json Manifest(const std::string& root, int64_t step) {
  return json::parse(ReadAll(StepDir(root, step) + "/manifest.json"));
}

void WriteManifest(const std::string& root, int64_t step, const json& j) {
  WriteAll(StepDir(root, step) + "/manifest.json", j.dump());
}

// Flips one bit of the data of `key` in the shard of `step`.
void FlipBit(const std::string& root, int64_t step, const std::string& key, uint64_t at = 5) {
  const json j = Manifest(root, step);
  const uint64_t off = j["shards"][0]["header_bytes"].get<uint64_t>() +
                       j["entries"][key]["data_offsets"][0].get<uint64_t>() + at;
  std::string shard = ReadAll(Shard(root, step));
  ASSERT_LT(off, shard.size());
  shard[off] = static_cast<char>(shard[off] ^ 0x10);
  WriteAll(Shard(root, step), shard);
}

// Runs `child` in a forked process; returns its exit status and what it
// wrote to `report` (a pipe).
struct ChildResult {
  int status = 0;
  std::string report;
  bool Exited0() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

ChildResult RunChild(const std::function<int(int report_fd)>& child) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    const int rc = child(p[1]);
    ::close(p[1]);
    ::_exit(rc);
  }
  ::close(p[1]);
  ChildResult r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof(buf))) > 0) r.report.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  ::waitpid(pid, &r.status, 0);
  return r;
}

void Report(int fd, const std::string& s) {
  if (::write(fd, s.data(), s.size()) < 0) ::_exit(99);
}

// ---------------------------------------------------------------- round trip and layout

TEST(Checkpoint, SaveThenRestoreRoundTripsEveryByte) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState saved;
  MustSave(*m, saved, 5);

  TestState restored;
  auto r = m->Restore(restored.registry);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->info.step, 5);
  EXPECT_EQ(r->info.path, StepDir(dir.path(), 5));
  EXPECT_EQ(r->info.job_id, "job-1");
  EXPECT_EQ(r->info.metadata.at("note"), "step 5");
  EXPECT_TRUE(r->skipped.empty());
  EXPECT_EQ(restored.step, 5);
  EXPECT_TRUE(restored.model.AllEqual(saved.model));
}

TEST(Checkpoint, LayoutIsOneDirectoryPerStepWithManifestAndShard) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1200);

  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(StepDir(dir.path(), 1200))) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "rank-00000.safetensors"}));
  EXPECT_TRUE(Leftovers(dir.path()).empty());

  const json j = Manifest(dir.path(), 1200);
  EXPECT_EQ(j["format"], "omni.checkpoint");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["step"], 1200);
  EXPECT_EQ(j["world_size"], 1);
  EXPECT_EQ(j["library_version"], Version());
  EXPECT_EQ(j["job_id"], "job-1");
  EXPECT_GT(j["created_unix_ms"].get<int64_t>(), 1'600'000'000'000);
  EXPECT_EQ(j["metadata"]["note"], "step 1200");
  ASSERT_EQ(j["shards"].size(), 1u);
  EXPECT_EQ(j["shards"][0]["rank"], 0);
  EXPECT_EQ(j["shards"][0]["file"], "rank-00000.safetensors");
  EXPECT_EQ(j["shards"][0]["bytes"].get<uint64_t>(), fs::file_size(Shard(dir.path(), 1200)));
  EXPECT_EQ(j["shards"][0]["xxh3"].get<std::string>().size(), 16u);

  const json& w = j["entries"]["model/w"];
  EXPECT_EQ(w["shard"], 0);
  EXPECT_EQ(w["dtype"], "F32");
  EXPECT_EQ(w["shape"], json::array({4, 4}));
  const std::vector<float>& data = s.model.tensors[0].data;
  EXPECT_EQ(w["xxh3"], HexDigest(Xxh3Of(data.data(), data.size() * sizeof(float))));
  const uint64_t begin = w["data_offsets"][0], end = w["data_offsets"][1];
  EXPECT_EQ(end - begin, 64u);
  // The bytes at data_offsets (after the header) are the tensor's.
  const std::string shard = ReadAll(Shard(dir.path(), 1200));
  const uint64_t header = j["shards"][0]["header_bytes"];
  EXPECT_EQ(std::memcmp(shard.data() + header + begin, data.data(), 64), 0);
  EXPECT_TRUE(j["entries"].contains("model/b"));
  EXPECT_TRUE(j["entries"].contains("train/step"));
  EXPECT_EQ(j["entries"]["train/step"]["dtype"], "U8");
}

TEST(Checkpoint, ListReturnsValidCheckpointsNewestFirstAndIgnoresOtherDirectories) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  for (int64_t step : {10, 30, 20}) MustSave(*m, s, step);
  fs::create_directories(StepDir(dir.path(), 40));  // no manifest: not a checkpoint
  fs::create_directories(dir / "unrelated");
  auto list = m->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].step, 30);
  EXPECT_EQ((*list)[1].step, 20);
  EXPECT_EQ((*list)[2].step, 10);
  EXPECT_GT((*list)[0].bytes, 0);
  EXPECT_EQ((*list)[0].format_version, 1);

  auto scan = ScanCheckpoints(dir.path());
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 4u);
  EXPECT_EQ((*scan)[0].info.step, 40);
  EXPECT_EQ((*scan)[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(Msg((*scan)[0].status), "manifest.json"));
}

TEST(Checkpoint, RetentionKeepsTheLastAndEveryKth) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.keep_last = 2;
  o.keep_every = 5;
  auto m = MustOpen(o);
  TestState s;
  for (int64_t step = 1; step <= 12; ++step) MustSave(*m, s, step);
  auto list = m->List();
  ASSERT_TRUE(list.ok());
  std::vector<int64_t> steps;
  for (const auto& c : *list) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{12, 11, 10, 5}));
  m.reset();  // joins the background deletions
  EXPECT_TRUE(Leftovers(dir.path()).empty());
}

TEST(Checkpoint, SavingAStepAgainReplacesItAtomically) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 7);
  s.Set(99);
  ASSERT_TRUE(m->Save(7, s.registry, {}).ok());
  TestState r;
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 7);
  EXPECT_EQ(r.step, 99);
  m.reset();  // joins the background deletion of the replaced one
  EXPECT_TRUE(Leftovers(dir.path()).empty());
}

TEST(Checkpoint, ZeroSizeTensorsRoundTrip) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> layout = {
      {"z2", {0, 3}}, {"w", {2}}, {"z1", {0}}, {"z0", {4, 0}}};
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s(layout);
  MustSave(*m, s, 1);
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 1)).ok());
  TestState r(layout);
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(r.model.AllEqual(s.model));
}

TEST(Checkpoint, RejectsBadOptionsAndSteps) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.rank = 2;
  o.world_size = 2;
  EXPECT_EQ(CheckpointManager::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(dir.path());
  o.keep_last = 0;
  EXPECT_EQ(CheckpointManager::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  EXPECT_EQ(m->Save(-1, s.registry, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Save(1'000'000'000'000, s.registry, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Checkpoint, RestoreWithoutCheckpointsIsNotFound) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  auto r = m->Restore(s.registry);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(Msg(r.status()), dir.path()));
}

TEST(Checkpoint, ManyTensorsOutgrowingTheHeaderReserveStillRoundTrip) {
  // ~20000 entries make a header larger than the initial 1 MiB reserve, so
  // the data is moved once; the next save reserves enough from the start.
  std::vector<std::pair<std::string, std::vector<int64_t>>> layout;
  for (int i = 0; i < 20000; ++i) layout.push_back({"layer" + std::to_string(i) + ".weight", {3}});
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s(layout);
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 1)).ok());
  TestState r(layout);
  auto res = m->Restore(r.registry, 1);
  ASSERT_TRUE(res.ok()) << res.status();
  s.Set(1);
  EXPECT_TRUE(r.model.AllEqual(s.model));
  const json j = Manifest(dir.path(), 2);
  EXPECT_GT(j["shards"][0]["header_bytes"].get<uint64_t>(), uint64_t{1} << 20);
}

// ---------------------------------------------------------------- bad input

TEST(Checkpoint, TruncatedShardFallsBackToThePreviousCheckpointNamingTheFile) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  fs::resize_file(Shard(dir.path(), 2), fs::file_size(Shard(dir.path(), 2)) - 10);

  TestState r;
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  EXPECT_EQ(r.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], Shard(dir.path(), 2)));
  EXPECT_TRUE(Contains(res->skipped[0], "truncated"));

  auto v = VerifyCheckpoint(StepDir(dir.path(), 2));
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(Msg(v), "rank-00000.safetensors"));
  auto list = m->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 1);
}

TEST(Checkpoint, BitFlipFallsBackAndTheReportNamesFileAndKey) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  FlipBit(dir.path(), 2, "model/b");

  TestState r;
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  EXPECT_EQ(r.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], Shard(dir.path(), 2)));
  EXPECT_TRUE(Contains(res->skipped[0], "'model/b'"));
  EXPECT_TRUE(Contains(res->skipped[0], "checksum"));

  auto v = VerifyCheckpoint(StepDir(dir.path(), 2));
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(Msg(v), "'model/b'"));
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 1)).ok());

  // Asking for the bad one explicitly returns its error.
  auto explicit_bad = m->Restore(r.registry, 2);
  EXPECT_EQ(explicit_bad.status().code(), absl::StatusCode::kDataLoss);
}

TEST(Checkpoint, CorruptOnlyCheckpointFailsNamingFileAndKeyAndSaysTheStateIsPartial) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 3);
  std::string shard = ReadAll(Shard(dir.path(), 3));
  shard[shard.size() - 1] = static_cast<char>(shard.back() ^ 1);  // the last key's bytes
  WriteAll(Shard(dir.path(), 3), shard);

  TestState r;
  r.Set(-1);
  auto res = m->Restore(r.registry);
  // Restore reads each shard once, checking every tensor where it lands: the
  // model was loaded before the bad key was met, and nothing older exists.
  EXPECT_EQ(res.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(Msg(res.status()), Shard(dir.path(), 3)));
  EXPECT_TRUE(Contains(Msg(res.status()), "'train/step'"));
  EXPECT_TRUE(Contains(Msg(res.status()), "checksum"));
  EXPECT_TRUE(Contains(Msg(res.status()), "partially loaded"));
  EXPECT_TRUE(Contains(Msg(res.status()), "unspecified state"));

  // Explicitly asked for, the same.
  auto explicit_bad = m->Restore(r.registry, 3);
  EXPECT_EQ(explicit_bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(Msg(explicit_bad.status()), "'train/step'"));
  EXPECT_TRUE(Contains(Msg(explicit_bad.status()), "partially loaded"));
}

TEST(Checkpoint, CorruptionCaughtBeforeAnyLoadLeavesTheStateUntouched) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 3);
  fs::resize_file(Shard(dir.path(), 3), fs::file_size(Shard(dir.path(), 3)) - 1);

  TestState r;
  r.Set(-1);
  auto res = m->Restore(r.registry);
  // Nothing was loaded; the only checkpoint is invalid, so no silent fresh start.
  EXPECT_EQ(res.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Contains(Msg(res.status()), "partially loaded"));
  EXPECT_EQ(r.model.loads, 0);
  EXPECT_EQ(r.step, -1);
}

TEST(Checkpoint, BitFlipInTheLastEntryRestoresThePreviousCheckpointEntirely) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  FlipBit(dir.path(), 2, "train/step", 1);  // the last entry: after the model's

  TestState r;
  r.Set(-1);
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], Shard(dir.path(), 2)));
  EXPECT_TRUE(Contains(res->skipped[0], "'train/step'"));
  EXPECT_TRUE(Contains(res->skipped[0], "checksum"));
  // The model was loaded from step 2 before the bad key was met, then again
  // from step 1: nothing of step 2 survives.
  EXPECT_EQ(r.model.loads, 2);
  TestState want;
  want.Set(1);
  EXPECT_TRUE(r.model.AllEqual(want.model));
  EXPECT_EQ(r.step, 1);
}

TEST(Checkpoint, BitFlipInALargeTensorFallsBack) {
  // Large enough to be read in pieces hashed on another thread.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> layout = {{"big", {5, 1 << 20}},
                                                                            {"small", {3}}};
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s(layout);
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  FlipBit(dir.path(), 2, "model/big", (uint64_t{9} << 20) + 3);

  TestState r(layout);
  r.Set(-1);
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], "'model/big'"));
  TestState want(layout);
  want.Set(1);
  EXPECT_TRUE(r.model.AllEqual(want.model));
  EXPECT_EQ(r.step, 1);

  // Intact, the large tensor round-trips.
  auto good = m->Restore(r.registry, 1);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE(r.model.AllEqual(want.model));
}

TEST(Checkpoint, ChecksumErrorsIgnoredByAStateObjectStillFallBack) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  FlipBit(dir.path(), 2, "model/w");
  // Reads everything and ignores what the reads return.
  class Careless final : public Stateful {
   public:
    absl::Status Save(StateWriter&) const override { return absl::OkStatus(); }
    absl::Status Load(const StateReader& r) override {
      (void)r.ReadTensor("w", DType::kF32, {4, 4}, w, sizeof(w));
      (void)r.ReadTensor("b", DType::kF32, {4}, b, sizeof(b));
      return absl::OkStatus();
    }
    float w[16] = {};
    float b[4] = {};
  } careless;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("model", &careless).ok());
  auto res = m->Restore(reg);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], "'model/w'"));
  TestState want;
  want.Set(1);
  EXPECT_EQ(std::vector<float>(careless.w, careless.w + 16), want.model.tensors[0].data);
}

TEST(Checkpoint, KeysNoObjectReadsAreStillVerified) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  FlipBit(dir.path(), 2, "model/b");
  // Reads model/w only.
  class OnlyW final : public Stateful {
   public:
    absl::Status Save(StateWriter&) const override { return absl::OkStatus(); }
    absl::Status Load(const StateReader& r) override {
      return r.ReadTensor("w", DType::kF32, {4, 4}, w, sizeof(w));
    }
    float w[16] = {};
  } only_w;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("model", &only_w).ok());
  auto res = m->Restore(reg);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], "'model/b'"));
}

TEST(Checkpoint, HeaderThatDisagreesWithTheManifestIsSkippedNamingTheKey) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  // The manifest of step 2 now claims other shapes for model/w (same bytes).
  json j = Manifest(dir.path(), 2);
  j["entries"]["model/w"]["shape"] = {2, 8};
  WriteManifest(dir.path(), 2, j);

  TestState r;
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_TRUE(Contains(res->skipped[0], "'model/w'"));
  EXPECT_TRUE(Contains(res->skipped[0], StepDir(dir.path(), 2)));
}

TEST(Checkpoint, ManifestForOtherShapesFailsNamingKeyAndFileAndKeepsThePreviousLoadable) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState small;
  MustSave(*m, small, 1);
  TestState other({{"w", {2, 8}}, {"b", {4}}});  // another model saved step 2
  MustSave(*m, other, 2);

  TestState r;
  r.Set(-1);
  auto res = m->Restore(r.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(Msg(res.status()), "'model/w'"));
  EXPECT_TRUE(Contains(Msg(res.status()), Shard(dir.path(), 2)));
  EXPECT_TRUE(Contains(Msg(res.status()), "[2,8]"));
  EXPECT_EQ(r.model.tensors[0].data[0], -1.0f) << "the model was not touched";

  auto prev = m->Restore(r.registry, 1);
  ASSERT_TRUE(prev.ok()) << prev.status();
  EXPECT_EQ(r.step, 1);
}

TEST(Checkpoint, MissingKeyFailsNamingKeyAndFile) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  TestState bigger({{"w", {4, 4}}, {"b", {4}}, {"extra", {2}}});
  auto res = m->Restore(bigger.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(Msg(res.status()), "'model/extra'"));
  EXPECT_TRUE(Contains(Msg(res.status()), Shard(dir.path(), 1)));
}

TEST(Checkpoint, MissingObjectFailsNamingItBeforeLoadingAnything) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  TestState r;
  Tensors sampler({{"cursor", {1}}});
  ASSERT_TRUE(r.registry.Register("sampler", &sampler).ok());
  auto res = m->Restore(r.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(Msg(res.status()), "'sampler'"));
  EXPECT_EQ(r.model.loads, 0);
}

TEST(Checkpoint, NewerFormatVersionIsRefusedNamingVersionAndPath) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  MustSave(*m, s, 2);
  json j = Manifest(dir.path(), 2);
  j["version"] = 2;
  WriteManifest(dir.path(), 2, j);

  TestState r;
  auto res = m->Restore(r.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(res.status()), "version 2"));
  EXPECT_TRUE(Contains(Msg(res.status()), StepDir(dir.path(), 2)));
  EXPECT_EQ(VerifyCheckpoint(StepDir(dir.path(), 2)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->Restore(r.registry, 1).ok());  // the older one is still readable
  auto list = m->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u);
}

TEST(Checkpoint, AnotherJobsCheckpointIsRefusedNamingBothIds) {
  TempDir dir;
  TestState s;
  {
    auto m = MustOpen(Options(dir.path()));
    MustSave(*m, s, 1);
  }
  CheckpointOptions o = Options(dir.path());
  o.job_id = "job-2";
  auto m = MustOpen(o);
  auto res = m->Restore(s.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(res.status()), "'job-1'"));
  EXPECT_TRUE(Contains(Msg(res.status()), "'job-2'"));
}

TEST(Checkpoint, ReadErrorsNameKeyAndFile) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  MustSave(*m, s, 1);
  // A state reading model/w as F64 gets a dtype error through the reader.
  class WrongDtype final : public Stateful {
   public:
    absl::Status Save(StateWriter&) const override { return absl::OkStatus(); }
    absl::Status Load(const StateReader& r) override {
      double d[16];
      return r.ReadTensor("w", DType::kF64, {4, 4}, d, sizeof(d));
    }
  } wrong;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("model", &wrong).ok());
  auto res = m->Restore(reg);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(Msg(res.status()), "'model/w'"));
  EXPECT_TRUE(Contains(Msg(res.status()), "F32"));
  EXPECT_TRUE(Contains(Msg(res.status()), Shard(dir.path(), 1)));
}

TEST(Checkpoint, ExceptionsFromStateObjectsBecomeErrors) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  struct Throws final : public Stateful {
    absl::Status Save(StateWriter& w) const override {
      const int32_t x = 1;
      if (auto st = w.PutTensor("x", DType::kI32, {}, &x, sizeof(x)); !st.ok()) return st;
      throw std::runtime_error("device lost");
    }
    absl::Status Load(const StateReader&) override { throw std::runtime_error("device lost"); }
  } throws;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("gpu", &throws).ok());
  auto st = m->Save(1, reg, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(Msg(st.status()), "device lost"));
  EXPECT_EQ(m->SaveAsync(1, reg, {}).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Leftovers(dir.path()).empty());

  TestState s;
  MustSave(*m, s, 2);
  StateRegistry load;
  ASSERT_TRUE(load.Register("model", &throws).ok());
  auto res = m->Restore(load);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Contains(Msg(res.status()), "device lost"));
}

// ---------------------------------------------------------------- writers and locks

TEST(Checkpoint, SecondWriterInTheSameProcessIsRefusedNamingTheDirectory) {
  TempDir dir;
  auto first = MustOpen(Options(dir.path()));
  auto second = CheckpointManager::Open(Options(dir.path()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(second.status()), dir.path()));
  first.reset();
  EXPECT_TRUE(CheckpointManager::Open(Options(dir.path())).ok());
}

TEST(Checkpoint, LiveWriterInAnotherProcessBlocksOpenUntilItIsKilled) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    auto m = CheckpointManager::Open(Options(dir.path()));
    const char c = m.ok() ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    while (true) ::pause();  // holds the lock until SIGKILLed
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(c, 'y');

  auto blocked = CheckpointManager::Open(Options(dir.path()));
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(blocked.status()), dir.path()));
  EXPECT_TRUE(Contains(Msg(blocked.status()), "pid " + std::to_string(pid)));

  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto after = CheckpointManager::Open(Options(dir.path()));
  EXPECT_TRUE(after.ok()) << after.status();
}

TEST(Checkpoint, UnwritableDirectoryFailsNamingIt) {
  TempDir dir;
  const std::string parent = dir / "ro";
  fs::create_directories(parent);
  const std::string inside = parent + "/ckpt";
  const std::string writable = dir / "rw";
  fs::create_directories(writable);
  // Root ignores permission bits: run as nobody when root.
  ASSERT_EQ(::chown(writable.c_str(), 65534, 65534), ::geteuid() == 0 ? 0 : -1);
  ::chmod(parent.c_str(), 0555);
  ::chmod(dir.path().c_str(), 0755);
  ChildResult r = RunChild([&](int fd) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 3;
    auto m = CheckpointManager::Open(Options(inside));
    if (m.ok()) return 4;
    Report(fd, absl::StrCat(static_cast<int>(m.status().code()), "|", m.status().message(), "\n"));
    if (::geteuid() != 65534) return 0;
    // A directory that becomes unwritable after Open: the save fails naming
    // it and the previous checkpoint stays loadable.
    auto w = CheckpointManager::Open(Options(writable));
    if (!w.ok()) return 5;
    TestState s;
    s.Set(1);
    if (!(*w)->Save(1, s.registry, {}).ok()) return 6;
    ::chmod(writable.c_str(), 0555);
    s.Set(2);
    auto st = (*w)->Save(2, s.registry, {});
    if (st.ok()) return 7;
    Report(fd,
           absl::StrCat(static_cast<int>(st.status().code()), "|", st.status().message(), "\n"));
    ::chmod(writable.c_str(), 0755);
    TestState back;
    auto res = (*w)->Restore(back.registry);
    if (!res.ok() || res->info.step != 1 || back.step != 1) return 8;
    return 0;
  });
  ::chmod(parent.c_str(), 0755);
  ASSERT_TRUE(r.Exited0()) << "child status " << r.status << ": " << r.report;
  std::vector<std::string> lines;
  std::stringstream ss(r.report);
  for (std::string line; std::getline(ss, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 1u);
  EXPECT_TRUE(
      Contains(lines[0], std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied))));
  EXPECT_TRUE(Contains(lines[0], inside));
  if (lines.size() > 1) {
    EXPECT_TRUE(
        Contains(lines[1], std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied))));
    EXPECT_TRUE(Contains(lines[1], writable));
  }
}

// ---------------------------------------------------------------- disk errors

TEST(Checkpoint, FileSizeLimitFailsNamingTheFileAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  ChildResult r = RunChild([&](int fd) {
    ::signal(SIGXFSZ, SIG_IGN);
    auto m = CheckpointManager::Open(Options(dir.path()));
    if (!m.ok()) return 2;
    TestState small({{"w", {64, 64}}});
    small.Set(1);
    if (!(*m)->Save(1, small.registry, {}).ok()) return 3;
    struct rlimit lim = {1 << 20, 1 << 20};  // 1 MiB per file
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 4;
    TestState big({{"w", {512, 1024}}});  // 2 MiB
    big.Set(2);
    auto st = (*m)->Save(2, big.registry, {});
    if (st.ok()) return 5;
    Report(fd, absl::StrCat(static_cast<int>(st.status().code()), "|", st.status().message()));
    return 0;
  });
  ASSERT_TRUE(r.Exited0()) << "child status " << r.status << ": " << r.report;
  EXPECT_TRUE(Contains(
      r.report, std::to_string(static_cast<int>(absl::StatusCode::kResourceExhausted)) + "|"));
  EXPECT_TRUE(Contains(r.report, "rank-00000.safetensors"));
  EXPECT_TRUE(Contains(r.report, "step 2"));
  EXPECT_TRUE(Leftovers(dir.path()).empty());
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 2)));
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 1)).ok());
  auto m = MustOpen(Options(dir.path()));
  TestState back({{"w", {64, 64}}});
  auto res = m->Restore(back.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->info.step, 1);
}

TEST(Checkpoint, FullDiskFailsNamingTheFileAndKeepsThePreviousCheckpoint) {
  TempDir dir;
  const std::string mnt = dir / "small";
  fs::create_directories(mnt);
  // A 2 MiB tmpfs in a private mount namespace of a child process.
  ChildResult r = RunChild([&](int fd) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=2m") != 0) {
      return 77;  // not permitted here
    }
    auto m = CheckpointManager::Open(Options(mnt));
    if (!m.ok()) return 2;
    TestState small({{"w", {64, 64}}});
    small.Set(1);
    if (!(*m)->Save(1, small.registry, {}).ok()) return 3;
    TestState big({{"w", {1024, 1024}}});  // 4 MiB
    big.Set(2);
    auto st = (*m)->Save(2, big.registry, {});
    if (st.ok()) return 4;
    Report(fd,
           absl::StrCat(static_cast<int>(st.status().code()), "|", st.status().message(), "\n"));
    for (const auto& e : fs::directory_iterator(mnt)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".tmp", 0) == 0 || n == "step-000000000002") return 5;
    }
    m->reset();
    auto again = CheckpointManager::Open(Options(mnt));
    if (!again.ok()) return 6;
    TestState back({{"w", {64, 64}}});
    auto res = (*again)->Restore(back.registry);
    if (!res.ok() || res->info.step != 1 || !back.model.AllEqual(small.model)) return 7;
    return 0;
  });
  if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 77) {
    GTEST_SKIP() << "cannot mount a tmpfs here (the RLIMIT_FSIZE test covers the path)";
  }
  ASSERT_TRUE(r.Exited0()) << "child status " << r.status << ": " << r.report;
  EXPECT_TRUE(Contains(
      r.report, std::to_string(static_cast<int>(absl::StatusCode::kResourceExhausted)) + "|"));
  EXPECT_TRUE(Contains(r.report, "rank-00000.safetensors"));
  EXPECT_TRUE(Contains(r.report, "No space left"));
}

// ---------------------------------------------------------------- crashes

TEST(Checkpoint, KillDuringSaveLeavesTheLastCommittedCheckpoint) {
  TempDir dir;
  std::mt19937 rng(12345);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> layout = {
      {"w", {1024, 1024}}, {"b", {1024}}};  // 4 MiB per save
  int interrupted = 0;                      // rounds killed while a save was in flight
  for (int round = 0; round < 6; ++round) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      CheckpointOptions o = Options(dir.path());
      o.keep_last = 2;
      auto m = CheckpointManager::Open(o);
      if (!m.ok()) ::_exit(2);
      TestState s(layout);
      auto res = (*m)->Restore(s.registry);
      int64_t step = res.ok() ? res->info.step : 0;
      while (true) {
        s.Set(++step);
        if (!(*m)->Save(step, s.registry, {}).ok()) ::_exit(3);
      }
    }
    // Let it commit at least one checkpoint, then kill it at a random point.
    const int64_t before = [&] {
      auto l = ListCheckpoints(dir.path());
      return l.ok() && !l->empty() ? (*l)[0].step : 0;
    }();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto l = ListCheckpoints(dir.path());
      if (l.ok() && !l->empty() && (*l)[0].step > before) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed on its own: " << status;

    int64_t newest = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step-", 0) == 0 && fs::exists(e.path() / "manifest.json")) {
        newest = std::max<int64_t>(newest, std::stoll(n.substr(5)));
      }
    }
    ASSERT_GT(newest, 0);
    interrupted += Leftovers(dir.path()).empty() ? 0 : 1;
    auto m = MustOpen(Options(dir.path()));
    EXPECT_TRUE(Leftovers(dir.path()).empty()) << "round " << round;
    TestState r(layout);
    auto res = m->Restore(r.registry);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->info.step, newest) << "round " << round;
    EXPECT_TRUE(res->skipped.empty()) << res->skipped[0];
    TestState want(layout);
    want.Set(newest);
    EXPECT_TRUE(r.model.AllEqual(want.model));
    EXPECT_EQ(r.step, newest);
  }
  std::printf("[          ] %d of 6 kills interrupted a save\n", interrupted);
}

TEST(Checkpoint, OpenRemovesTemporaryFilesOfCrashedWriters) {
  TempDir dir;
  fs::create_directories(dir / ".tmp-step-000000000003");
  WriteAll(dir / ".tmp-step-000000000003/rank-00000.safetensors", "partial");
  WriteAll(dir / ".tmp-step-000000000003/manifest.json", "{");
  fs::create_directories(dir / ".trash-step-000000000001-123");
  WriteAll(dir / ".trash-step-000000000001-123/rank-00000.safetensors", "old");
  auto m = MustOpen(Options(dir.path()));
  EXPECT_TRUE(Leftovers(dir.path()).empty());
}

TEST(Checkpoint, OpenKeepsTheFilesOfAnotherLiveRank) {
  TempDir dir;
  CheckpointOptions o1 = Options(dir.path());
  o1.world_size = 2;
  o1.rank = 1;
  auto rank1 = MustOpen(o1);  // live
  fs::create_directories(dir / ".tmp-step-000000000003");
  WriteAll(dir / ".tmp-step-000000000003/rank-00001.safetensors", "being written");
  WriteAll(dir / ".tmp-step-000000000003/rank-00000.safetensors", "stale");
  CheckpointOptions o0 = o1;
  o0.rank = 0;
  auto rank0 = MustOpen(o0);
  EXPECT_TRUE(fs::exists(dir / ".tmp-step-000000000003/rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-000000000003/rank-00000.safetensors"));
}

// ---------------------------------------------------------------- several ranks

TEST(Checkpoint, TwoRanksAsThreadsCommitOneCheckpointWithAShardEach) {
  TempDir dir;
  std::unique_ptr<CheckpointManager> mgr[2];
  for (int r = 0; r < 2; ++r) {
    CheckpointOptions o = Options(dir.path());
    o.world_size = 2;
    o.rank = r;
    o.shard_timeout = absl::Seconds(30);
    mgr[r] = MustOpen(o);
    ASSERT_NE(mgr[r], nullptr);
  }
  TestState state[2];
  absl::Status result[2];
  for (int64_t step : {1, 2}) {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        state[r].Set(step * 10 + r);
        auto st = mgr[r]->Save(step, state[r].registry, {{"rank", std::to_string(r)}});
        result[r] = st.status();
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_TRUE(result[0].ok()) << result[0];
    ASSERT_TRUE(result[1].ok()) << result[1];
  }
  const json j = Manifest(dir.path(), 2);
  EXPECT_EQ(j["world_size"], 2);
  ASSERT_EQ(j["shards"].size(), 2u);
  EXPECT_EQ(j["shards"][1]["file"], "rank-00001.safetensors");
  EXPECT_EQ(j["entries"]["1:model/w"]["key"], "model/w");
  EXPECT_EQ(j["entries"]["1:model/w"]["shard"], 1);
  EXPECT_TRUE(j["entries"].contains("0:model/w"));
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 2)).ok());
  EXPECT_TRUE(Leftovers(dir.path()).empty());
  for (int r = 0; r < 2; ++r) {
    TestState back;
    auto res = mgr[r]->Restore(back.registry);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->info.step, 2);
    EXPECT_EQ(back.step, 20 + r) << "each rank reads its own shard";
  }
}

TEST(Checkpoint, RankZeroGivesUpNamingTheMissingRank) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;
  o.shard_timeout = absl::Milliseconds(100);
  auto m = MustOpen(o);
  TestState s;
  s.Set(1);
  auto st = m->Save(1, s.registry, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(Msg(st.status()), "rank(s) 1"));
  EXPECT_TRUE(Contains(Msg(st.status()), "rank-00001.json"));
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 1)));
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-000000000001/rank-00000.safetensors"));
}

TEST(Checkpoint, RankZeroIgnoresAShardLeftByACrashedRankBeforeItOpened) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;
  o.rank = 1;
  o.shard_timeout = absl::Seconds(60);
  const std::string fragment = dir / ".tmp-step-000000000001/rank-00001.json";
  const pid_t pid = ::fork();
  if (pid == 0) {  // rank 1 writes its shard, then dies waiting for rank 0
    auto m = CheckpointManager::Open(o);
    if (!m.ok()) ::_exit(2);
    TestState s;
    s.Set(1);
    (void)(*m)->Save(1, s.registry, {});
    ::_exit(3);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(fragment) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ASSERT_TRUE(fs::exists(fragment));
  // Written well before this run (file times are coarse).
  const struct timespec past[2] = {{1, 0}, {1, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, fragment.c_str(), past, 0), 0);

  o.rank = 0;
  o.shard_timeout = absl::Milliseconds(200);
  auto m = MustOpen(o);
  TestState s;
  s.Set(1);
  auto st = m->Save(1, s.registry, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded) << st.status();
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 1)));
}

TEST(Checkpoint, RestoreRefusesACheckpointWithoutAShardForThisRank) {
  TempDir dir;
  {
    auto m = MustOpen(Options(dir.path()));
    TestState s;
    MustSave(*m, s, 1);
  }
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;
  o.rank = 1;
  auto m = MustOpen(o);
  TestState r;
  auto res = m->Restore(r.registry);
  EXPECT_EQ(res.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(Msg(res.status()), "rank 1"));
  EXPECT_TRUE(Contains(Msg(res.status()), StepDir(dir.path(), 1)));
}

TEST(Checkpoint, OtherRankGivesUpWhenRankZeroNeverCommits) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;
  o.rank = 1;
  o.shard_timeout = absl::Milliseconds(100);
  auto m = MustOpen(o);
  TestState s;
  s.Set(1);
  auto st = m->Save(1, s.registry, {});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(Msg(st.status()), "rank 0"));
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-000000000001/rank-00001.safetensors"));
}

// ---------------------------------------------------------------- asynchronous saves

TEST(Checkpoint, AsyncSaveTakesASnapshotBeforeReturning) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  TestState s;
  s.Set(3);
  auto stats = m->SaveAsync(3, s.registry, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->background);
  EXPECT_GE(stats->snapshot_s, 0.0);
  EXPECT_EQ(stats->bytes, 4 * 16 + 4 * 4 + 8);
  s.Set(999);  // training goes on while the write runs
  ASSERT_TRUE(m->WaitForPending().ok());
  TestState r;
  auto res = m->Restore(r.registry);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(r.step, 3);
  TestState want;
  want.Set(3);
  EXPECT_TRUE(r.model.AllEqual(want.model));
}

TEST(Checkpoint, AsyncSavesReusingTheSnapshotMemoryKeepEachStepsValues) {
  for (const bool keep : {true, false}) {
    TempDir dir;
    CheckpointOptions o = Options(dir.path());
    o.keep_snapshot_memory = keep;
    auto m = MustOpen(o);
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layout = {
        {"big", {5, 1 << 20}}, {"small", {7}}};  // a block of its own, and a shared one
    TestState s(layout);
    for (int64_t step = 1; step <= 3; ++step) {
      s.Set(step);
      ASSERT_TRUE(m->SaveAsync(step, s.registry, {}).ok());
      ASSERT_TRUE(m->WaitForPending().ok());
    }
    for (int64_t step = 1; step <= 3; ++step) {
      TestState r(layout), want(layout);
      want.Set(step);
      auto res = m->Restore(r.registry, step);
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_TRUE(r.model.AllEqual(want.model)) << "step " << step << " keep " << keep;
    }
  }
}

TEST(Checkpoint, AsyncSaveSkipsWhileOneIsPendingWhenToldNotToWait) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;  // rank 0's write waits for rank 1: pending until it saves
  o.wait_for_pending = false;
  o.shard_timeout = absl::Seconds(30);
  auto m = MustOpen(o);
  CheckpointOptions o1 = o;
  o1.rank = 1;
  auto rank1 = MustOpen(o1);
  TestState s, s1;
  s.Set(1);
  auto first = m->SaveAsync(1, s.registry, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->background);
  auto second = m->SaveAsync(2, s.registry, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->skipped);
  EXPECT_EQ(second->bytes, 0);
  EXPECT_EQ(m->WaitForPending(absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
  s1.Set(1);
  ASSERT_TRUE(rank1->Save(1, s1.registry, {}).ok());
  ASSERT_TRUE(m->WaitForPending(absl::Seconds(30)).ok());
  EXPECT_TRUE(fs::exists(StepDir(dir.path(), 1) + "/manifest.json"));
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 2)));
}

TEST(Checkpoint, AsyncErrorLatchesAndSurfacesOnce) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.world_size = 2;  // no rank 1: every write of rank 0 times out
  o.shard_timeout = absl::Milliseconds(50);
  auto m = MustOpen(o);
  TestState s;
  s.Set(1);
  ASSERT_TRUE(m->SaveAsync(1, s.registry, {}).ok());
  auto st = m->WaitForPending();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(Msg(st), "step 1"));
  EXPECT_TRUE(m->WaitForPending().ok()) << "reported once";

  // The next SaveAsync waits for the failing one and returns its error.
  ASSERT_TRUE(m->SaveAsync(2, s.registry, {}).ok());
  auto next = m->SaveAsync(3, s.registry, {});
  EXPECT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(Msg(next.status()), "step 2"));
}

TEST(Checkpoint, AsyncSaveOfAStateLargerThanTheLimitIsSynchronous) {
  TempDir dir;
  CheckpointOptions o = Options(dir.path());
  o.max_snapshot_bytes = 32;
  auto m = MustOpen(o);
  TestState s;
  s.Set(4);
  auto stats = m->SaveAsync(4, s.registry, {});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_FALSE(stats->background);
  EXPECT_GT(stats->write_s, 0.0);
  EXPECT_TRUE(fs::exists(StepDir(dir.path(), 4) + "/manifest.json")) << "durable on return";
}

TEST(Checkpoint, DestructorWaitsForThePendingWrite) {
  TempDir dir;
  TestState s;
  {
    auto m = MustOpen(Options(dir.path()));
    s.Set(6);
    ASSERT_TRUE(m->SaveAsync(6, s.registry, {}).ok());
  }
  EXPECT_TRUE(VerifyCheckpoint(StepDir(dir.path(), 6)).ok());
}

// ---------------------------------------------------------------- memory

TEST(Checkpoint, SynchronousSaveStreamsWithoutCopyingTheState) {
  TempDir dir;
  ChildResult r = RunChild([&](int fd) {
    TestState s({{"w", {32, 1024, 1024}}});  // 128 MiB
    s.Set(1);                                // touches every page
    auto m = CheckpointManager::Open(Options(dir.path()));
    if (!m.ok()) return 2;
    struct rusage before, after;
    ::getrusage(RUSAGE_SELF, &before);
    auto st = (*m)->Save(1, s.registry, {});
    ::getrusage(RUSAGE_SELF, &after);
    if (!st.ok()) return 3;
    Report(fd, std::to_string((after.ru_maxrss - before.ru_maxrss) / 1024));
    return 0;
  });
  ASSERT_TRUE(r.Exited0()) << r.status;
  EXPECT_LT(std::stol(r.report), 64) << "MiB of extra resident memory";
}

// ---------------------------------------------------------------- the CLI

std::string BinDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

int RunCli(const std::string& args, std::string& out) {
  const std::string cmd = BinDir() + "/omni " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  out.clear();
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Checkpoint, CliListsVerifiesAndShowsCheckpoints) {
  if (!fs::exists(BinDir() + "/omni")) GTEST_SKIP() << "the omni CLI is not built";
  TempDir dir;
  {
    auto m = MustOpen(Options(dir.path()));
    TestState s;
    MustSave(*m, s, 1);
    MustSave(*m, s, 2);
  }
  std::string out;
  EXPECT_EQ(RunCli("ckpt ls " + dir.path(), out), 0) << out;
  EXPECT_TRUE(Contains(out, "STEP"));
  EXPECT_TRUE(Contains(out, "yes"));
  EXPECT_EQ(RunCli("ckpt verify " + dir.path(), out), 0) << out;
  EXPECT_EQ(RunCli("ckpt verify " + StepDir(dir.path(), 2), out), 0) << out;
  EXPECT_EQ(RunCli("ckpt show " + StepDir(dir.path(), 2), out), 0) << out;
  EXPECT_TRUE(Contains(out, "model/w"));
  EXPECT_TRUE(Contains(out, "job-1"));

  std::string shard = ReadAll(Shard(dir.path(), 2));
  shard.back() = static_cast<char>(shard.back() ^ 1);
  WriteAll(Shard(dir.path(), 2), shard);
  EXPECT_EQ(RunCli("ckpt verify " + StepDir(dir.path(), 2), out), 1) << out;
  EXPECT_TRUE(Contains(out, "rank-00000.safetensors"));
  EXPECT_TRUE(Contains(out, "'train/step'"));
  EXPECT_EQ(RunCli("ckpt verify " + dir.path(), out), 1) << out;
  EXPECT_TRUE(Contains(out, "OK   " + StepDir(dir.path(), 1)));
  EXPECT_EQ(RunCli("ckpt bogus " + dir.path(), out), 2);
}

// ---------------------------------------------------------------- safetensors compatibility

// An independent reader of the published format
// (https://huggingface.co/docs/safetensors): u64 little-endian header size,
// JSON header, data buffer entirely indexed by back-to-back data_offsets.
constexpr const char* kPythonReader = R"PY(
import json, struct, sys
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
         "F16": 2, "BF16": 2, "F32": 4, "F64": 8}
FMT = {"BOOL": "?", "U8": "B", "I8": "b", "I16": "h", "I32": "i", "I64": "q",
       "F32": "f", "F64": "d"}
blob = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
assert 8 + n <= len(blob), "header length beyond the file"
assert n % 8 == 0, "header not padded to 8"
text = blob[8:8 + n].decode("utf-8")
assert text.startswith("{"), "header does not start with {"
header = json.loads(text)
data = blob[8 + n:]
meta = header.pop("__metadata__", {})
assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
pos = 0
for begin, end, key in sorted((v["data_offsets"][0], v["data_offsets"][1], k)
                              for k, v in header.items()):
    assert begin == pos, "hole before " + key
    pos = end
assert pos == len(data), "data buffer not entirely indexed"
out = {"__metadata__": meta}
for key, v in header.items():
    begin, end = v["data_offsets"]
    count = 1
    for d in v["shape"]:
        count *= d
    assert end - begin == count * SIZES[v["dtype"]], key
    raw = data[begin:end]
    if v["dtype"] in FMT:
        values = list(struct.unpack("<%d%s" % (count, FMT[v["dtype"]]), raw))
    else:
        values = raw.hex()
    out[key] = {"dtype": v["dtype"], "shape": v["shape"], "values": values}
print(json.dumps(out))
)PY";

class Mixed final : public Stateful {
 public:
  absl::Status Save(StateWriter& w) const override {
    const float f[6] = {1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f};
    if (auto st = w.PutTensor("f32", DType::kF32, {2, 3}, f, sizeof(f)); !st.ok()) return st;
    const int64_t i = -1234567890123;
    if (auto st = w.PutTensor("i64", DType::kI64, {}, &i, sizeof(i)); !st.ok()) return st;
    const uint16_t bf[3] = {0x3f80, 0xc000, 0x7f80};
    if (auto st = w.PutTensor("bf16", DType::kBF16, {3}, bf, sizeof(bf)); !st.ok()) return st;
    if (auto st = w.PutTensor("empty", DType::kF64, {0, 4}, nullptr, 0); !st.ok()) return st;
    return w.PutBytes("blob", std::string("\x00\x01\xff", 3));
  }
  absl::Status Load(const StateReader&) override { return absl::OkStatus(); }
};

TEST(Safetensors, ShardIsReadableByAnIndependentPythonReader) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir dir;
  Mixed mixed;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("m", &mixed).ok());
  auto m = MustOpen(Options(dir.path()));
  ASSERT_TRUE(m->Save(9, reg, {}).ok());
  WriteAll(dir / "reader.py", kPythonReader);
  const std::string cmd = "/usr/bin/python3 " + (dir / "reader.py") + " " + Shard(dir.path(), 9);
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["__metadata__"]["format"], "omni.checkpoint");
  EXPECT_EQ(j["__metadata__"]["step"], "9");
  EXPECT_EQ(j["m/f32"]["shape"], json::array({2, 3}));
  const std::vector<float> f = {1.5f, -2.25f, 3e-8f, 1e30f, 0.0f, -0.0f};
  ASSERT_EQ(j["m/f32"]["values"].size(), 6u);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(static_cast<float>(j["m/f32"]["values"][i].get<double>()), f[i]);
  }
  EXPECT_TRUE(std::signbit(j["m/f32"]["values"][5].get<double>()));
  EXPECT_EQ(j["m/i64"]["values"][0].get<int64_t>(), -1234567890123);
  EXPECT_EQ(j["m/i64"]["shape"], json::array());
  EXPECT_EQ(j["m/bf16"]["values"], "803f00c0807f");
  EXPECT_EQ(j["m/empty"]["shape"], json::array({0, 4}));
  EXPECT_EQ(j["m/blob"]["dtype"], "U8");
  EXPECT_EQ(j["m/blob"]["values"], json::array({0, 1, 255}));
}

TEST(Safetensors, HeaderFollowsTheFormatByteForByte) {
  TempDir dir;
  Mixed mixed;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("m", &mixed).ok());
  auto m = MustOpen(Options(dir.path()));
  ASSERT_TRUE(m->Save(9, reg, {}).ok());
  const std::string blob = ReadAll(Shard(dir.path(), 9));
  ASSERT_GE(blob.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(blob[i]);
  ASSERT_LE(8 + n, blob.size());
  EXPECT_EQ(n % 8, 0u);
  const std::string text = blob.substr(8, n);
  EXPECT_EQ(text.front(), '{');
  const size_t last = text.find_last_not_of(' ');
  EXPECT_EQ(text[last], '}') << "padding is spaces only";
  const json h = json::parse(text);
  uint64_t total = 0;
  for (const auto& [k, v] : h.items()) {
    if (k == "__metadata__") continue;
    total += v["data_offsets"][1].get<uint64_t>() - v["data_offsets"][0].get<uint64_t>();
  }
  EXPECT_EQ(8 + n + total, blob.size());
  // The f32 tensor's bytes are its raw little-endian values.
  const uint64_t b = h["m/f32"]["data_offsets"][0];
  float first;
  std::memcpy(&first, blob.data() + 8 + n + b, 4);
  EXPECT_EQ(first, 1.5f);
}

TEST(Safetensors, WriterRejectsMalformedKeysDuplicatesAndWrongSizesNamingTheKey) {
  TempDir dir;
  auto m = MustOpen(Options(dir.path()));
  struct Bad final : public Stateful {
    int mode = 0;
    absl::Status Save(StateWriter& w) const override {
      float x[4] = {};
      if (mode == 0) return w.PutTensor("a b", DType::kF32, {4}, x, sizeof(x));
      if (mode == 1) {
        if (auto st = w.PutTensor("x", DType::kF32, {4}, x, sizeof(x)); !st.ok()) return st;
        return w.PutTensor("x", DType::kF32, {4}, x, sizeof(x));
      }
      return w.PutTensor("short", DType::kF32, {5}, x, sizeof(x));
    }
    absl::Status Load(const StateReader&) override { return absl::OkStatus(); }
  } bad;
  StateRegistry reg;
  ASSERT_TRUE(reg.Register("bad", &bad).ok());
  const char* want[] = {"'bad/a b'", "duplicate key 'bad/x'", "'bad/short'"};
  for (int mode = 0; mode < 3; ++mode) {
    bad.mode = mode;
    auto st = m->Save(1, reg, {});
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(Msg(st.status()), want[mode]));
    auto async = m->SaveAsync(1, reg, {});
    EXPECT_EQ(async.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(fs::exists(StepDir(dir.path(), 1)));
  EXPECT_TRUE(Leftovers(dir.path()).empty());
}

}  // namespace
}  // namespace omni
