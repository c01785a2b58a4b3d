// Reading job-level checkpoints (private): a step directory and its
// manifest, the checks of its parts, a StateReader over the replicated state
// of every part, listing, and the job's shared lock. Used by the manager
// (ckpt/job_checkpoint.cc) and the tools' functions (omni/job_checkpoint.h).
//
// Thread safety: plain functions; a JobReader is used by one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckpt/job_manifest.h"
#include "ckpt/safetensors.h"
#include "ckpt/step_dirs.h"
#include "common/fs.h"
#include "common/strings.h"
#include "omni/checkpoint.h"
#include "omni/job_checkpoint.h"

namespace omni::ckpt {

constexpr const char* kJobManifest = "manifest.json";
constexpr size_t kJobMaxManifestBytes = CheckpointManager::kMaxManifestBytes;

// A step directory opened for reading (no symbolic link followed) and its
// manifest.
struct StepDir {
  Fd fd;
  JobManifest m;
};

// Opens `name` under `dir` (at `path`) and parses its job-level manifest:
// NotFound without one; the parser's errors.
absl::StatusOr<StepDir> LoadStep(internal::FileSystem& fs, int dir, const std::string& name,
                                 const std::string& path);
// A step directory the user named.
absl::StatusOr<StepDir> LoadStepPath(const std::string& path);
// Opens part `rank` and checks its size and header against the manifest;
// its entries (sorted by offset) into `entries_out` when not null.
absl::StatusOr<Fd> OpenCheckedPart(internal::FileSystem& fs, const StepDir& sd, int rank,
                                   std::vector<TensorEntry>* entries_out = nullptr);
// The cheap checks of every part.
absl::Status CheckStep(internal::FileSystem& fs, const StepDir& sd);

// The replicated state of a checkpoint, read from every part.
class JobReader final : public StateReader {
 public:
  static absl::StatusOr<std::unique_ptr<JobReader>> Open(internal::FileSystem& fs,
                                                         const StepDir& sd) {
    auto r = std::unique_ptr<JobReader>(new JobReader(sd.m));
    for (int p = 0; p < sd.m.world_size; ++p) {
      std::vector<TensorEntry> entries;
      absl::StatusOr<Fd> fd = OpenCheckedPart(fs, sd, p, &entries);
      if (!fd.ok()) return fd.status();
      r->parts_.push_back(ShardReader::Open(Join(sd.m.dir, sd.m.parts[p].file), *std::move(fd),
                                            sd.m.parts[p].header_bytes, std::move(entries)));
    }
    return r;
  }
  absl::StatusOr<Info> Find(std::string_view key) const override {
    const JobTensor* t = Lookup(key);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("key '", internal::Sv(key), "' not in the checkpoint ", m_.dir));
    }
    return Info{t->dtype, t->shape, static_cast<size_t>(t->nbytes)};
  }
  absl::Status ReadTensor(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                          void* dst, size_t nbytes) const override {
    const JobTensor* t = Lookup(key);
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("key '", internal::Sv(key), "' not in the checkpoint ", m_.dir));
    }
    if (t->dtype != dtype || t->shape != shape || t->nbytes != nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", internal::Sv(key), "' in ", m_.dir, " is ", DTypeName(t->dtype), " ",
          ShapeString(t->shape), ", expected ", DTypeName(dtype), " ", ShapeString(shape)));
    }
    for (const JobPiece& p : t->pieces) {
      if (auto st = parts_[p.part]->ReadTensor(key, dtype, PieceShape(*t, p),
                                               static_cast<char*>(dst) + p.begin, p.end - p.begin);
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReadBytes(std::string_view key) const override {
    absl::StatusOr<Info> info = Find(key);
    if (!info.ok()) return info.status();
    if (info->dtype != DType::kU8 || info->shape.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", internal::Sv(key), "' in ", m_.dir, " is not a byte blob"));
    }
    std::string out(info->nbytes, '\0');
    if (auto st = ReadTensor(key, info->dtype, info->shape, out.data(), out.size()); !st.ok()) {
      return st;
    }
    return out;
  }
  std::vector<std::string> Keys(std::string_view prefix) const override {
    std::vector<std::string> out;
    for (const JobTensor& t : m_.replicated) {
      if (t.key.compare(0, prefix.size(), prefix.data(), prefix.size()) == 0) out.push_back(t.key);
    }
    return out;
  }
  bool any_read() const {
    return std::any_of(parts_.begin(), parts_.end(), [](const auto& p) { return p->any_read(); });
  }
  // The first read error of any part, else the first unread entry that
  // fails its checksum.
  absl::Status Verdict(bool verify_unread) const {
    for (const auto& p : parts_) {
      if (!p->read_error().ok()) return p->read_error();
    }
    if (!verify_unread) return absl::OkStatus();
    for (const auto& p : parts_) {
      if (auto st = p->VerifyUnread(); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

 private:
  explicit JobReader(const JobManifest& m) : m_(m) {}
  const JobTensor* Lookup(std::string_view key) const {
    auto it = std::lower_bound(m_.replicated.begin(), m_.replicated.end(), key,
                               [](const JobTensor& t, std::string_view k) { return t.key < k; });
    return it != m_.replicated.end() && it->key == key ? &*it : nullptr;
  }
  const JobManifest& m_;
  std::vector<std::unique_ptr<ShardReader>> parts_;
};

// Each one's manifest and the cheap checks of its parts.
std::vector<CheckpointStatus> ScanAt(internal::FileSystem& fs, int dir,
                                     const std::vector<StepName>& dirs);
std::vector<JobPartInfo> PartsOf(const JobManifest& m);

// Joins the job's shared lock on `dir` (see omni/job_checkpoint.h).
// FailedPrecondition naming both job ids when another job holds it.
// `while_first` (when set) runs when no other live process held the lock,
// before any other can join: the removal of what crashed saves left must not
// race a replica that joins and starts a save.
absl::StatusOr<Fd> JoinJobLock(internal::FileSystem& fs, int dir, const std::string& dir_path,
                               const std::string& job_id,
                               const std::function<void()>& while_first = nullptr);

}  // namespace omni::ckpt
