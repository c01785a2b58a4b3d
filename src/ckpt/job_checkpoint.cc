// JobCheckpointManager: job-level checkpoints shared by an elastic job's
// replicas (see include/omni/job_checkpoint.h for the layout and protocol).
// The manifest and the plan live in ckpt/job_manifest.cc; the shards are
// written and read with ckpt/safetensors.h, as CheckpointManager does.
#include "omni/job_checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt/ckpt_util.h"
#include "ckpt/job_checkpoint_fs.h"
#include "ckpt/job_manifest.h"
#include "ckpt/job_reader.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_dirs.h"
#include "common/fs.h"
#include "common/strings.h"
#include "omni/hash.h"
#include "omni/version.h"

namespace omni {
namespace {

using internal::Guard;
using internal::NowUnixMs;
using internal::Poller;
using internal::RandomId;
using internal::Seconds;
// The longest wait between two looks for the other ranks' files (Poller).
constexpr absl::Duration kPollMax = absl::Milliseconds(20);

using ckpt::Fd;
using ckpt::JobFragment;
using ckpt::JobManifest;
using ckpt::JobPart;
using ckpt::JobPiece;
using ckpt::JobTensor;
using ckpt::PlanItem;
using ckpt::TensorEntry;
using internal::DirEntry;
using internal::FileStat;
using internal::FileSystem;
using internal::FileType;
using internal::Sv;
using Metadata = std::map<std::string, std::string>;
using ckpt::CheckStep;
using ckpt::JobReader;
using ckpt::Join;
using ckpt::JoinJobLock;
using ckpt::LoadStep;
using ckpt::ParseStepDir;
using ckpt::PartsOf;
using ckpt::ScanAt;
using ckpt::StepDir;
using ckpt::StepDirName;
using ckpt::StepDirs;
using ckpt::StepName;

constexpr const char* kAborted = "ABORTED";
constexpr const char* kTmpPrefix = ".tmp-step-";
constexpr const char* kTrashPrefix = ".trash-";
constexpr int64_t kMaxStep = 999'999'999'999;

constexpr const char* kManifest = ckpt::kJobManifest;
constexpr size_t kMaxManifestBytes = ckpt::kJobMaxManifestBytes;

std::optional<int64_t> TmpStep(std::string_view name) {
  if (name.size() < 22 || name.substr(0, 10) != kTmpPrefix) return std::nullopt;
  return ParseStepDir(absl::StrCat("step-", Sv(name.substr(10, 12))));
}

// ---------------------------------------------------------------- writers

// Lists the tensors a registry saves, copying nothing.
class ListingWriter final : public StateWriter {
 public:
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    if (auto st = ckpt::CheckPut(key, dtype, shape, data, nbytes); !st.ok()) return st;
    items_.push_back({std::string(key), dtype, std::move(shape), nbytes});
    return absl::OkStatus();
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                     bytes.size());
  }
  std::vector<PlanItem>& items() { return items_; }

 private:
  std::vector<PlanItem> items_;
};

// Passes this replica's slice [lo, hi) of the replicated byte stream on to
// the shard, as pieces; checks that the state is the one listed.
class SliceWriter final : public StateWriter {
 public:
  SliceWriter(StateWriter& out, const std::vector<PlanItem>& items, uint64_t lo, uint64_t hi,
              int size, int rank)
      : out_(out), items_(items), lo_(lo), hi_(hi), last_(rank == size - 1) {}
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    if (next_ >= items_.size() || items_[next_].key != key || items_[next_].nbytes != nbytes ||
        items_[next_].dtype != dtype || items_[next_].shape != shape) {
      return absl::InternalError(absl::StrCat("state key '", Sv(key),
                                              "' changed between listing and saving (a Stateful "
                                              "must save the same keys, dtypes and shapes)"));
    }
    ++next_;
    const uint64_t start = pos_;
    pos_ += nbytes;
    // A zero-size tensor belongs to the replica whose slice holds its
    // position (the last one at the very end).
    if (nbytes == 0) {
      if ((start >= lo_ && start < hi_) || (last_ && start >= hi_)) {
        pieces_[std::string(key)] = {0, 0};
        return out_.PutTensor(key, dtype, std::move(shape), data, 0);
      }
      return absl::OkStatus();
    }
    const uint64_t b = std::max(start, lo_);
    const uint64_t e = std::min(start + nbytes, hi_);
    if (b >= e) return absl::OkStatus();
    pieces_[std::string(key)] = {b - start, e - start};
    bytes_ += e - b;
    if (b == start && e == start + nbytes) {
      return out_.PutTensor(key, dtype, std::move(shape), data, nbytes);
    }
    const size_t el = DTypeSize(dtype);
    return out_.PutTensor(key, dtype, {static_cast<int64_t>((e - b) / el)},
                          static_cast<const char*>(data) + (b - start), e - b);
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    return PutTensor(key, DType::kU8, {static_cast<int64_t>(bytes.size())}, bytes.data(),
                     bytes.size());
  }
  absl::Status Finish() const {
    if (next_ != items_.size()) {
      return absl::InternalError("the replicated state saved fewer tensors than it listed");
    }
    return absl::OkStatus();
  }
  // Key -> byte range within the tensor.
  const std::map<std::string, std::pair<uint64_t, uint64_t>>& pieces() const { return pieces_; }
  uint64_t bytes() const { return bytes_; }

 private:
  StateWriter& out_;
  const std::vector<PlanItem>& items_;
  uint64_t lo_, hi_;
  bool last_;
  size_t next_ = 0;
  uint64_t pos_ = 0;
  uint64_t bytes_ = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> pieces_;
};

// Counts the data bytes a registry writes through it.
class CountingWriter final : public StateWriter {
 public:
  explicit CountingWriter(StateWriter& out) : out_(out) {}
  absl::Status PutTensor(std::string_view key, DType dtype, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) override {
    bytes_ += nbytes;
    return out_.PutTensor(key, dtype, std::move(shape), data, nbytes);
  }
  absl::Status PutBytes(std::string_view key, std::string_view bytes) override {
    bytes_ += bytes.size();
    return out_.PutBytes(key, bytes);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  StateWriter& out_;
  uint64_t bytes_ = 0;
};

// ---------------------------------------------------------------- the manager

// What crashed saves left in `dir`, when no other replica is alive to be
// writing (JoinJobLock's while_first: no replica can join meanwhile).
void RemoveCrashedSaves(internal::FileSystem& fs, int dir, const std::string& dir_path) {
  absl::StatusOr<std::vector<DirEntry>> names = fs.List(dir, dir_path);
  if (!names.ok()) return;
  for (const DirEntry& e : *names) {
    if ((e.name.rfind(kTmpPrefix, 0) == 0 || e.name.rfind(kTrashPrefix, 0) == 0) &&
        e.type == FileType::kDirectory) {
      internal::RemoveTreeAt(fs, dir, e.name, Join(dir_path, e.name)).IgnoreError();
    }
  }
}

class JobCheckpointManagerImpl final : public JobCheckpointManager {
 public:
  JobCheckpointManagerImpl(JobCheckpointOptions o, FileSystem& fs, Fd dir, Fd lock)
      : opt_(std::move(o)), fs_(fs), dir_(std::move(dir)), lock_(std::move(lock)) {}

  absl::StatusOr<JobSaveStats> Save(int64_t step, const JobSaveGroup& group,
                                    const StateRegistry& replicated,
                                    const StateRegistry& per_replica,
                                    const Metadata& metadata) override;
  absl::StatusOr<JobSaveStats> SaveAlone(int64_t step, const StateRegistry& replicated,
                                         const StateRegistry& per_replica,
                                         const Metadata& metadata) override;
  absl::StatusOr<std::vector<CheckpointInfo>> List() const override {
    absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
    if (!dirs.ok()) return dirs.status();
    std::vector<CheckpointInfo> out;
    for (CheckpointStatus& c : ScanAt(fs_, dir_.get(), *dirs)) {
      if (c.status.ok()) out.push_back(std::move(c.info));
    }
    return out;
  }
  absl::StatusOr<std::vector<JobPartInfo>> Parts(int64_t step) const override {
    absl::StatusOr<StepDir> sd =
        LoadStep(fs_, dir_.get(), StepDirName(step), PathOf(StepDirName(step)));
    if (!sd.ok()) return sd.status();
    return PartsOf(sd->m);
  }
  absl::StatusOr<CheckpointManager::RestoreResult> RestoreReplicated(
      const StateRegistry& replicated, std::optional<int64_t> step) override;
  absl::Status RestorePerReplica(const StateRegistry& per_replica, int64_t step, int part) override;

 private:
  struct Written {
    JobFragment fragment;  // the part's description
    std::vector<PlanItem> items;
    JobSaveStats stats;
  };
  std::string PathOf(const std::string& name) const { return Join(opt_.dir, name); }
  // Writes part `rank` of `size` into the open directory `tmp_fd`.
  absl::StatusOr<Written> WritePart(int64_t step, int rank, int size, uint64_t token, int tmp_fd,
                                    const std::string& tmp, const StateRegistry& replicated,
                                    const StateRegistry& per_replica);
  absl::StatusOr<JobManifest> Gather(int64_t step, const JobSaveGroup& group, int tmp_fd,
                                     const std::string& tmp, Written mine,
                                     const Metadata& metadata);
  absl::Status WaitForCommit(int64_t step, const JobSaveGroup& group, int tmp_fd,
                             const std::string& tmp);
  absl::Status WriteManifest(const JobManifest& m, int tmp_fd, const std::string& tmp);
  absl::Status Publish(const std::string& tmp_name, const std::string& final_name, bool replace);
  void ApplyRetention(int64_t saved_step);
  void RemoveStaleTmpDirs(int64_t below_step);

  const JobCheckpointOptions opt_;
  FileSystem& fs_;
  const Fd dir_;
  Fd lock_;
  uint64_t header_reserve_ = 4096;
};

absl::Status CheckStepNumber(int64_t step) {
  if (step < 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", step, " is outside [0, ", kMaxStep, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobCheckpointManagerImpl::Written> JobCheckpointManagerImpl::WritePart(
    int64_t step, int rank, int size, uint64_t token, int tmp_fd, const std::string& tmp,
    const StateRegistry& replicated, const StateRegistry& per_replica) {
  const auto t0 = std::chrono::steady_clock::now();
  Written w;
  {
    ListingWriter listing;
    if (auto st = Guard("listing", [&] { return replicated.SaveAll(listing); }); !st.ok()) {
      return st;
    }
    w.items = std::move(listing.items());
  }
  const std::vector<uint64_t> cuts = ckpt::PlanCuts(w.items, size);
  const std::string file = ckpt::PartFileName(rank);
  const std::string path = Join(tmp, file);
  const Metadata shard_md = {{"format", "omni.checkpoint"},        {"layout", ckpt::kJobLayout},
                             {"step", std::to_string(step)},       {"rank", std::to_string(rank)},
                             {"world_size", std::to_string(size)}, {"job_id", opt_.job_id},
                             {"replica_id", opt_.replica_id},      {"token", HexDigest(token)}};
  absl::StatusOr<std::unique_ptr<ckpt::ShardWriter>> writer =
      ckpt::ShardWriter::Create(fs_, tmp_fd, file, path, header_reserve_);
  if (!writer.ok()) return writer.status();
  SliceWriter slice(**writer, w.items, cuts[rank], cuts[rank + 1], size, rank);
  if (auto st = Guard("saving", [&] { return replicated.SaveAll(slice); }); !st.ok()) return st;
  if (auto st = slice.Finish(); !st.ok()) return st;
  CountingWriter own(**writer);
  if (auto st = Guard("saving", [&] { return per_replica.SaveAll(own); }); !st.ok()) return st;
  absl::StatusOr<ckpt::ShardSummary> summary = (*writer)->Finish(shard_md);
  if (!summary.ok()) return summary.status();
  header_reserve_ =
      ckpt::HeaderBytesFor(summary->header_json_bytes + summary->header_json_bytes / 4 + 1024);
  JobFragment& f = w.fragment;
  f.step = step;
  f.token = token;
  f.size = size;
  f.plan_digest = ckpt::PlanDigest(w.items);
  f.part.rank = rank;
  f.part.replica_id = opt_.replica_id;
  f.part.file = file;
  f.part.bytes = summary->file_bytes;
  f.part.header_bytes = summary->header_bytes;
  f.part.header_xxh3 = summary->header_xxh3;
  f.part.xxh3 = summary->xxh3;
  f.part.replicated_bytes = slice.bytes();
  f.part.replica_bytes = own.bytes();
  for (TensorEntry& e : summary->entries) {
    auto it = slice.pieces().find(e.key);
    if (it == slice.pieces().end()) {
      f.per_replica.push_back(std::move(e));
      continue;
    }
    JobPiece p;
    p.part = rank;
    p.begin = it->second.first;
    p.end = it->second.second;
    p.data_begin = e.begin;
    p.data_end = e.end;
    p.xxh3 = e.xxh3;
    f.pieces[e.key] = p;
  }
  w.stats.bytes = static_cast<int64_t>(f.part.bytes);
  w.stats.replicated_bytes = static_cast<int64_t>(f.part.replicated_bytes);
  w.stats.replica_bytes = static_cast<int64_t>(f.part.replica_bytes);
  w.stats.write_s = Seconds(t0);
  return w;
}

// Builds the manifest from this part and, with several replicas, the others'
// descriptions (rank 0), waiting for them.
absl::StatusOr<JobManifest> JobCheckpointManagerImpl::Gather(int64_t step,
                                                             const JobSaveGroup& group, int tmp_fd,
                                                             const std::string& tmp, Written mine,
                                                             const Metadata& metadata) {
  std::vector<JobFragment> frags(group.size);
  frags[0] = std::move(mine.fragment);
  std::vector<bool> have(group.size, false);
  have[0] = true;
  int missing = group.size - 1;
  Poller poll(opt_.part_timeout, kPollMax);
  while (missing > 0) {
    for (int r = 1; r < group.size; ++r) {
      if (have[r]) continue;
      const std::string name = ckpt::PartFragmentName(r);
      absl::StatusOr<std::string> text =
          internal::ReadFileAt(fs_, tmp_fd, name, Join(tmp, name), kMaxManifestBytes);
      if (!text.ok()) {
        if (absl::IsNotFound(text.status())) continue;
        return text.status();
      }
      absl::StatusOr<JobFragment> f = ckpt::ParseJobFragment(*text, Join(tmp, name));
      if (!f.ok()) return f.status();
      if (f->token != group.token || f->step != step) continue;  // an earlier attempt's
      if (f->size != group.size || f->part.rank != r) {
        return absl::DataLossError(absl::StrCat(Join(tmp, name), ": written for rank ",
                                                f->part.rank, " of ", f->size, ", not ", r, " of ",
                                                group.size));
      }
      if (f->plan_digest != frags[0].plan_digest) {
        return absl::FailedPreconditionError(absl::StrCat(
            "replica ", r, " ('", f->part.replica_id,
            "') saved a replicated state whose keys, dtypes or shapes differ from rank 0's"));
      }
      absl::StatusOr<FileStat> st = fs_.Stat(tmp_fd, f->part.file, Join(tmp, f->part.file));
      if (!st.ok() || st->type != FileType::kRegular || st->size != f->part.bytes) {
        return absl::DataLossError(absl::StrCat(
            Join(tmp, f->part.file), ": missing, not a regular file or not of its recorded size"));
      }
      frags[r] = *std::move(f);
      have[r] = true;
      --missing;
    }
    if (missing == 0) break;
    absl::StatusOr<std::string> aborted =
        internal::ReadFileAt(fs_, tmp_fd, kAborted, Join(tmp, kAborted), 4096);
    if (aborted.ok() && *aborted == HexDigest(group.token)) {
      return absl::AbortedError(
          absl::StrCat("another replica gave up the save (", tmp, "/", kAborted, ")"));
    }
    if (group.check) {
      if (absl::Status st = group.check(); !st.ok()) return st;
    }
    if (poll.Expired()) {
      std::vector<int> late;
      for (int r = 1; r < group.size; ++r) {
        if (!have[r]) late.push_back(r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("replica rank(s) ", absl::StrJoin(late, ","),
                       " did not write their part within ", absl::FormatDuration(opt_.part_timeout),
                       " (waiting for ", tmp, "/", ckpt::PartFragmentName(late[0]), ")"));
    }
    poll.Wait();
  }
  JobManifest m;
  m.dir = PathOf(StepDirName(step));
  m.step = step;
  m.world_size = group.size;
  m.library_version = Version();
  m.job_id = opt_.job_id;
  m.token = group.token;
  m.metadata = metadata;
  for (const PlanItem& it : mine.items) {
    JobTensor t;
    t.key = it.key;
    t.dtype = it.dtype;
    t.shape = it.shape;
    t.nbytes = it.nbytes;
    m.replicated.push_back(std::move(t));
  }
  std::sort(m.replicated.begin(), m.replicated.end(),
            [](const JobTensor& a, const JobTensor& b) { return a.key < b.key; });
  for (const JobFragment& f : frags) {  // rank order: pieces in byte order
    m.parts.push_back(f.part);
    m.per_replica.push_back(f.per_replica);
    for (const auto& [key, piece] : f.pieces) {
      auto it =
          std::lower_bound(m.replicated.begin(), m.replicated.end(), key,
                           [](const JobTensor& t, const std::string& k) { return t.key < k; });
      if (it == m.replicated.end() || it->key != key) {
        return absl::DataLossError(absl::StrCat("part ", f.part.rank, " holds key '", key,
                                                "' that is not replicated state"));
      }
      it->pieces.push_back(piece);
    }
  }
  m.created_unix_ms = NowUnixMs();
  return m;
}

absl::Status JobCheckpointManagerImpl::WriteManifest(const JobManifest& m, int tmp_fd,
                                                     const std::string& tmp) {
  const std::string text = ckpt::JobManifestJson(m);
  if (text.size() > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Join(tmp, kManifest), ": the manifest would take ", text.size(),
                     " bytes, more than the limit of ", kMaxManifestBytes, " a reader accepts"));
  }
  // Checked as a reader will check it, before it is committed.
  if (absl::StatusOr<JobManifest> back = ckpt::ParseJobManifest(text, m.dir); !back.ok()) {
    return absl::InternalError(
        absl::StrCat("the manifest written would not read back: ", back.status().message()));
  }
  // Nothing but the manifest and the parts goes into the checkpoint.
  if (absl::StatusOr<std::vector<DirEntry>> names = fs_.List(tmp_fd, tmp); names.ok()) {
    std::set<std::string> keep = {kManifest};
    for (const JobPart& p : m.parts) keep.insert(p.file);
    for (const DirEntry& e : *names) {
      if (keep.count(e.name) == 0) {
        internal::RemoveTreeAt(fs_, tmp_fd, e.name, Join(tmp, e.name)).IgnoreError();
      }
    }
  }
  if (auto st = internal::WriteFileSyncedAt(fs_, tmp_fd, kManifest, text, Join(tmp, kManifest));
      !st.ok()) {
    return st;
  }
  return fs_.Sync(tmp_fd, tmp);
}

absl::Status JobCheckpointManagerImpl::Publish(const std::string& tmp_name,
                                               const std::string& final_name, bool replace) {
  const std::string what = absl::StrCat(PathOf(tmp_name), " -> ", PathOf(final_name));
  absl::Status st = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, false, what);
  if (st.ok() || !absl::IsAlreadyExists(st) || !replace) return st;
  // Swap atomically with the existing checkpoint of this step, then delete
  // the old one (now under the temporary name, which a later commit or Open
  // removes after a crash).
  st = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, true, what);
  if (st.ok()) {
    internal::RemoveTreeAt(fs_, dir_.get(), tmp_name, PathOf(tmp_name)).IgnoreError();
    return absl::OkStatus();
  }
  if (!absl::IsUnimplemented(st)) return st;
  const std::string trash = absl::StrCat(kTrashPrefix, final_name, "-", HexDigest(RandomId()));
  if (auto r = fs_.Rename(dir_.get(), final_name, dir_.get(), trash, false, what); !r.ok())
    return r;
  if (auto r = fs_.Rename(dir_.get(), tmp_name, dir_.get(), final_name, false, what); !r.ok()) {
    fs_.Rename(dir_.get(), trash, dir_.get(), final_name, false, what).IgnoreError();
    return r;
  }
  internal::RemoveTreeAt(fs_, dir_.get(), trash, PathOf(trash)).IgnoreError();
  return absl::OkStatus();
}

absl::Status JobCheckpointManagerImpl::WaitForCommit(int64_t step, const JobSaveGroup& group,
                                                     int tmp_fd, const std::string& tmp) {
  const std::string final_name = StepDirName(step);
  const auto committed = [&]() {
    absl::StatusOr<StepDir> sd = LoadStep(fs_, dir_.get(), final_name, PathOf(final_name));
    return sd.ok() && sd->m.token == group.token;
  };
  Poller poll(opt_.part_timeout, kPollMax);
  while (true) {
    if (committed()) return absl::OkStatus();
    absl::StatusOr<std::string> aborted =
        internal::ReadFileAt(fs_, tmp_fd, kAborted, Join(tmp, kAborted), 4096);
    if (aborted.ok() && *aborted == HexDigest(group.token)) {
      return absl::AbortedError(
          absl::StrCat("a replica gave up the save (", tmp, "/", kAborted, ")"));
    }
    if (group.check) {
      if (absl::Status st = group.check(); !st.ok()) return st;
    }
    if (poll.Expired()) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank 0 did not commit within ", absl::FormatDuration(opt_.part_timeout),
                       " (waiting for ", PathOf(final_name), "/", kManifest, ")"));
    }
    poll.Wait();
  }
}

absl::StatusOr<JobSaveStats> JobCheckpointManagerImpl::Save(int64_t step, const JobSaveGroup& group,
                                                            const StateRegistry& replicated,
                                                            const StateRegistry& per_replica,
                                                            const Metadata& metadata) {
  if (auto st = CheckStepNumber(step); !st.ok()) return st;
  if (group.size < 1 || group.rank < 0 || group.rank >= group.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("JobSaveGroup rank ", group.rank, " of size ", group.size));
  }
  const std::string tmp_name = absl::StrCat(kTmpPrefix, StepDirName(step).substr(5));
  const std::string tmp = PathOf(tmp_name);
  const auto failed = [&](const absl::Status& st) {
    return absl::Status(st.code(),
                        absl::StrCat("checkpoint step ", step, " in ", opt_.dir, " (replica rank ",
                                     group.rank, " of ", group.size, "): ", st.message()));
  };
  // The save's directory gone while this replica was held up (frozen,
  // descheduled): the others gave this save up and a later save removed it
  // (RemoveStaleTmpDirs). Nothing of it can land: abandoned, as when a peer
  // dies during it.
  const auto removed = [&](const absl::Status& st) {
    return absl::AbortedError(absl::StrCat(
        tmp, " was removed: the other replicas gave this save up (", st.message(), ")"));
  };
  if (auto st = fs_.Mkdir(dir_.get(), tmp_name, tmp); !st.ok() && !absl::IsAlreadyExists(st)) {
    return failed(st);
  }
  absl::StatusOr<Fd> tmp_fd = fs_.OpenDir(dir_.get(), tmp_name, tmp);
  // (Made or found a moment ago: removed since, between the two calls.)
  if (absl::IsNotFound(tmp_fd.status())) return failed(removed(tmp_fd.status()));
  if (!tmp_fd.ok()) return failed(tmp_fd.status());
  const std::string part = ckpt::PartFileName(group.rank);
  const std::string frag = ckpt::PartFragmentName(group.rank);
  const auto remove_mine = [&]() {
    for (const std::string& n : {part, frag, frag + ".part"}) {
      fs_.Remove(tmp_fd->get(), n, false, Join(tmp, n)).IgnoreError();
    }
  };
  remove_mine();  // an earlier attempt's
  absl::StatusOr<Written> w = WritePart(step, group.rank, group.size, group.token, tmp_fd->get(),
                                        tmp, replicated, per_replica);
  absl::Status st = w.status();
  const auto t1 = std::chrono::steady_clock::now();
  if (st.ok() && group.rank == 0) {
    JobSaveStats stats = w->stats;
    absl::StatusOr<JobManifest> m =
        Gather(step, group, tmp_fd->get(), tmp, *std::move(w), metadata);
    st = m.status();
    if (st.ok()) st = WriteManifest(*m, tmp_fd->get(), tmp);
    if (st.ok()) st = Publish(tmp_name, StepDirName(step), /*replace=*/true);
    if (st.ok()) st = fs_.Sync(dir_.get(), opt_.dir);
    if (st.ok()) {
      stats.commit_s = Seconds(t1);
      ApplyRetention(step);
      RemoveStaleTmpDirs(step);
      return stats;
    }
    // The others stop waiting; the partial directory never gets a manifest.
    fs_.Remove(tmp_fd->get(), kManifest, false, Join(tmp, kManifest)).IgnoreError();
    internal::WriteFileSyncedAt(fs_, tmp_fd->get(), kAborted, HexDigest(group.token),
                                Join(tmp, kAborted))
        .IgnoreError();
  } else if (st.ok()) {
    // Described aside, then renamed in: rank 0 never reads half of it.
    st = internal::WriteFileSyncedAt(fs_, tmp_fd->get(), frag + ".part",
                                     ckpt::JobFragmentJson(w->fragment), Join(tmp, frag + ".part"));
    if (st.ok()) {
      st = fs_.Rename(tmp_fd->get(), frag + ".part", tmp_fd->get(), frag, false, Join(tmp, frag));
    }
    if (st.ok()) st = fs_.Sync(tmp_fd->get(), tmp);
    if (st.ok()) st = WaitForCommit(step, group, tmp_fd->get(), tmp);
    if (st.ok()) {
      JobSaveStats stats = w->stats;
      stats.commit_s = Seconds(t1);
      return stats;
    }
  }
  // (The name may exist again: a later save of the same step made a new
  // directory there. The one this save holds open is unlinked.)
  const auto unlinked = [&] {
    const absl::StatusOr<FileStat> held = fs_.Stat(tmp_fd->get(), "", tmp);
    return held.ok() && held->links == 0;
  };
  if (!absl::IsAborted(st) && unlinked()) st = removed(st);
  if (group.rank != 0 && !absl::IsAborted(st)) {  // rank 0 stops waiting for this part
    internal::WriteFileSyncedAt(fs_, tmp_fd->get(), kAborted, HexDigest(group.token),
                                Join(tmp, kAborted))
        .IgnoreError();
  }
  remove_mine();
  fs_.Remove(dir_.get(), tmp_name, /*directory=*/true, tmp).IgnoreError();  // only when empty
  return failed(st);
}

absl::StatusOr<JobSaveStats> JobCheckpointManagerImpl::SaveAlone(int64_t step,
                                                                 const StateRegistry& replicated,
                                                                 const StateRegistry& per_replica,
                                                                 const Metadata& metadata) {
  if (auto st = CheckStepNumber(step); !st.ok()) return st;
  const uint64_t token = RandomId();
  const std::string tmp_name =
      absl::StrCat(kTmpPrefix, StepDirName(step).substr(5), "-alone-", HexDigest(token));
  const std::string tmp = PathOf(tmp_name);
  const auto failed = [&](const absl::Status& st) {
    internal::RemoveTreeAt(fs_, dir_.get(), tmp_name, tmp).IgnoreError();
    return absl::Status(st.code(),
                        absl::StrCat("checkpoint step ", step, " in ", opt_.dir, " (replica '",
                                     opt_.replica_id, "' alone): ", st.message()));
  };
  if (auto st = fs_.Mkdir(dir_.get(), tmp_name, tmp); !st.ok()) return failed(st);
  absl::StatusOr<Fd> tmp_fd = fs_.OpenDir(dir_.get(), tmp_name, tmp);
  if (!tmp_fd.ok()) return failed(tmp_fd.status());
  JobSaveGroup alone;
  alone.token = token;
  absl::StatusOr<Written> w =
      WritePart(step, 0, 1, token, tmp_fd->get(), tmp, replicated, per_replica);
  if (!w.ok()) return failed(w.status());
  const auto t1 = std::chrono::steady_clock::now();
  JobSaveStats stats = w->stats;
  stats.solo = true;
  absl::StatusOr<JobManifest> m = Gather(step, alone, tmp_fd->get(), tmp, *std::move(w), metadata);
  if (!m.ok()) return failed(m.status());
  if (auto st = WriteManifest(*m, tmp_fd->get(), tmp); !st.ok()) return failed(st);
  absl::Status st = Publish(tmp_name, StepDirName(step), /*replace=*/false);
  if (absl::IsAlreadyExists(st)) {
    internal::RemoveTreeAt(fs_, dir_.get(), tmp_name, tmp).IgnoreError();
    stats.kept_existing = true;
    return stats;
  }
  if (st.ok()) st = fs_.Sync(dir_.get(), opt_.dir);
  if (!st.ok()) return failed(st);
  stats.commit_s = Seconds(t1);
  ApplyRetention(step);
  return stats;
}

// As CheckpointManager's: valid checkpoints only are counted, the newest
// valid one always stays.
void JobCheckpointManagerImpl::ApplyRetention(int64_t saved_step) {
  absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
  if (!dirs.ok()) return;
  int kept = 0;
  for (const StepName& d : *dirs) {
    if (d.step != saved_step) {
      absl::StatusOr<StepDir> sd = LoadStep(fs_, dir_.get(), d.name, d.path);
      if (!sd.ok() || !CheckStep(fs_, *sd).ok()) continue;
    }
    bool keep = d.step == saved_step;
    if (kept < opt_.keep_last) {
      keep = true;
      ++kept;
    }
    if (opt_.keep_every > 0 && d.step % opt_.keep_every == 0) keep = true;
    if (keep) continue;
    const std::string trash = absl::StrCat(kTrashPrefix, d.name, "-", HexDigest(RandomId()));
    if (fs_.Rename(dir_.get(), d.name, dir_.get(), trash, false, d.path).ok()) {
      internal::RemoveTreeAt(fs_, dir_.get(), trash, PathOf(trash)).IgnoreError();
    }
  }
}

// Temporary directories of saves before `below_step` can no longer commit
// (every replica saves the steps in order): leftovers of failed attempts.
void JobCheckpointManagerImpl::RemoveStaleTmpDirs(int64_t below_step) {
  absl::StatusOr<std::vector<DirEntry>> names = fs_.List(dir_.get(), opt_.dir);
  if (!names.ok()) return;
  for (const DirEntry& e : *names) {
    const std::optional<int64_t> s = TmpStep(e.name);
    if (s && *s < below_step && e.type == FileType::kDirectory &&
        e.name.find("-alone-") == std::string::npos) {
      internal::RemoveTreeAt(fs_, dir_.get(), e.name, PathOf(e.name)).IgnoreError();
    }
  }
}

absl::StatusOr<CheckpointManager::RestoreResult> JobCheckpointManagerImpl::RestoreReplicated(
    const StateRegistry& replicated, std::optional<int64_t> step) {
  std::vector<StepName> candidates;
  if (step) {
    if (auto st = CheckStepNumber(*step); !st.ok()) return st;
    const std::string name = StepDirName(*step);
    if (!fs_.Stat(dir_.get(), name, PathOf(name)).ok()) {
      return absl::NotFoundError(absl::StrCat("no checkpoint of step ", *step, " in ", opt_.dir));
    }
    candidates.push_back({*step, name, PathOf(name)});
  } else {
    absl::StatusOr<std::vector<StepName>> dirs = StepDirs(fs_, dir_.get(), opt_.dir);
    if (!dirs.ok()) return dirs.status();
    candidates = *std::move(dirs);
  }
  CheckpointManager::RestoreResult result;
  std::string partial;
  const auto note = [&partial]() { return ckpt::PartialLoadNote(partial); };
  for (const StepName& cand : candidates) {
    absl::StatusOr<StepDir> sd = LoadStep(fs_, dir_.get(), cand.name, cand.path);
    absl::Status st = sd.status();
    if (absl::IsFailedPrecondition(st)) {  // newer format or another layout: never skipped
      return absl::Status(st.code(), absl::StrCat(st.message(), note()));
    }
    if (st.ok() && !opt_.job_id.empty() && !sd->m.job_id.empty() && sd->m.job_id != opt_.job_id) {
      return absl::FailedPreconditionError(
          absl::StrCat(cand.path, " belongs to job '", sd->m.job_id, "', this job is '",
                       opt_.job_id, "'; refusing to restore another job's checkpoint", note()));
    }
    absl::StatusOr<std::unique_ptr<JobReader>> reader =
        st.ok() ? JobReader::Open(fs_, *sd) : absl::StatusOr<std::unique_ptr<JobReader>>(st);
    if (!reader.ok()) {
      if (step) return reader.status();
      result.skipped.push_back(std::string(reader.status().message()));
      continue;
    }
    const absl::Status loaded = Guard("loading", [&] { return replicated.LoadAll(**reader); });
    if ((*reader)->any_read()) partial = cand.path;
    absl::Status bad = (*reader)->Verdict(/*verify_unread=*/loaded.ok());
    if (!bad.ok()) {
      if (step) return absl::Status(bad.code(), absl::StrCat(bad.message(), note()));
      result.skipped.push_back(std::string(bad.message()));
      continue;
    }
    if (!loaded.ok()) {
      return absl::Status(loaded.code(),
                          absl::StrCat("restore ", cand.path, ": ", loaded.message(), note()));
    }
    result.info = sd->m.Info();
    return result;
  }
  return ckpt::NoValidCheckpoint(opt_.dir, result.skipped, partial, candidates.size(),
                                 opt_.start_fresh, "start_fresh");
}

absl::Status JobCheckpointManagerImpl::RestorePerReplica(const StateRegistry& per_replica,
                                                         int64_t step, int part) {
  if (auto st = CheckStepNumber(step); !st.ok()) return st;
  absl::StatusOr<StepDir> sd =
      LoadStep(fs_, dir_.get(), StepDirName(step), PathOf(StepDirName(step)));
  if (!sd.ok()) return sd.status();
  if (part < 0 || part >= sd->m.world_size) {
    return absl::NotFoundError(
        absl::StrCat(sd->m.dir, " has ", sd->m.world_size, " part(s), no part ", part));
  }
  std::vector<TensorEntry> entries;
  absl::StatusOr<Fd> fd = OpenCheckedPart(fs_, *sd, part, &entries);
  if (!fd.ok()) return fd.status();
  const std::unique_ptr<ckpt::ShardReader> reader =
      ckpt::ShardReader::Open(Join(sd->m.dir, sd->m.parts[part].file), *std::move(fd),
                              sd->m.parts[part].header_bytes, std::move(entries));
  absl::Status loaded = Guard("loading", [&] { return per_replica.LoadAll(*reader); });
  if (!reader->read_error().ok()) return reader->read_error();
  return loaded;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobCheckpointManager>> JobCheckpointManager::Open(
    const JobCheckpointOptions& options) {
  return internal::OpenJobCheckpointManagerOn(options, internal::RealFileSystem());
}

absl::StatusOr<std::unique_ptr<JobCheckpointManager>> internal::OpenJobCheckpointManagerOn(
    const JobCheckpointOptions& options, FileSystem& fs) {
  if (options.dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  if (options.job_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory ", options.dir,
                     ": a job-level checkpoint needs a job id (JobCheckpointOptions.job_id)"));
  }
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last ", options.keep_last, " is below 1"));
  }
  if (options.part_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("part_timeout must be positive");
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) return ErrnoStatus(ec.value(), absl::StrCat("create checkpoint directory ", options.dir));
  absl::StatusOr<Fd> dir = fs.OpenDir(AT_FDCWD, options.dir, options.dir);
  if (!dir.ok()) return dir.status();
  const int dir_fd = dir->get();
  absl::StatusOr<Fd> lock = JoinJobLock(fs, dir_fd, options.dir, options.job_id,
                                        [&] { RemoveCrashedSaves(fs, dir_fd, options.dir); });
  if (!lock.ok()) return lock.status();
  return std::make_unique<JobCheckpointManagerImpl>(options, fs, *std::move(dir), *std::move(lock));
}

}  // namespace omni
