// The step directories of a checkpoint directory, shared by the per-rank
// checkpointer (checkpoint.cc) and the job checkpointer (job_checkpoint.cc,
// job_reader.cc): their names ("step-000000001200"), listing them newest
// first, and scanning them into CheckpointStatus rows. Private to omni_core.
//
// Thread safety: the functions are thread-safe (the FileSystem's calls are).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/fs.h"
#include "omni/checkpoint.h"

namespace omni::ckpt {

// `dir` + "/" + `name` (no second slash after a trailing one).
std::string Join(const std::string& dir, const std::string& name);
// "step-000000001200" for step 1200.
std::string StepDirName(int64_t step);
// The step of "step-000000001200" (exactly 12 digits); nullopt for any other name.
std::optional<int64_t> ParseStepDir(std::string_view name);

// DataLoss naming `manifest_path` when the step directory `dir_path` is named
// for another step than the `step` its manifest records (a directory not
// named "step-…" is not checked: the user named it).
absl::Status CheckStepMatchesDirName(const std::string& dir_path, const std::string& manifest_path,
                                     int64_t step);
// `path` without its trailing slashes ("/" stays "/").
std::string TrimTrailingSlashes(std::string path);

// The text of the manifest.json of the step directory open as `dir` (at
// `step_path`), at most CheckpointManager::kMaxManifestBytes: NotFound
// naming the directory when it has none (not a checkpoint); the
// FileSystem's errors.
absl::StatusOr<std::string> ReadManifestAt(internal::FileSystem& fs, int dir,
                                           const std::string& step_path);

// Opens the step directory `name` under `dir` (at `path`; no symbolic link
// followed), parses its manifest with `parse(text, path)` (an
// absl::StatusOr of a manifest with a `step`) and checks that step against
// the directory's name. SD has members `fd` and `m`. The FileSystem's,
// ReadManifestAt's, the parser's and CheckStepMatchesDirName's errors.
template <typename SD, typename Parse>
absl::StatusOr<SD> LoadStepDir(internal::FileSystem& fs, int dir, const std::string& name,
                               const std::string& path, Parse&& parse) {
  SD out;
  absl::StatusOr<internal::Fd> fd = fs.OpenDir(dir, name, path);
  if (!fd.ok()) return fd.status();
  out.fd = *std::move(fd);
  absl::StatusOr<std::string> text = ReadManifestAt(fs, out.fd.get(), path);
  if (!text.ok()) return text.status();
  auto m = parse(*text, path);
  if (!m.ok()) return m.status();
  if (absl::Status st = CheckStepMatchesDirName(path, Join(path, "manifest.json"), m->step);
      !st.ok()) {
    return st;
  }
  out.m = *std::move(m);
  return out;
}

// What a restore that found no valid checkpoint in `dir` returns.
// `skipped`: why each checkpoint was skipped; `partial`: the checkpoint the
// state objects last read from without success ("" = none), which makes it
// DataLoss (PartialLoadNote says so); `candidates`: the step directories
// tried. FailedPrecondition when there were some but `start_fresh` is false
// (starting from step 0 would silently throw the job's progress away, and
// retention would then delete them; `fresh_option` names the option that
// allows it); NotFound otherwise.
absl::Status NoValidCheckpoint(const std::string& dir, const std::vector<std::string>& skipped,
                               const std::string& partial, size_t candidates, bool start_fresh,
                               const char* fresh_option);
// "" when `partial` is empty, else a note that the state objects may hold a
// partial load from it.
std::string PartialLoadNote(const std::string& partial);

// A step directory entry under a checkpoint directory.
struct StepName {
  int64_t step = 0;
  std::string name;
  std::string path;  // Join(the checkpoint directory's path, name)
};

// Every step directory under the open directory `dir` (at `path`), newest
// first; the FileSystem's error when it cannot be listed.
absl::StatusOr<std::vector<StepName>> StepDirs(internal::FileSystem& fs, int dir,
                                               const std::string& path);

// One CheckpointStatus per entry of `dirs`, in their order: `load(d)` opens
// and parses d's manifest (absl::StatusOr<S> with a member `m` whose Info()
// gives the CheckpointInfo); `check(s)` checks the loaded step. A step whose
// load fails keeps its step and path and the load's error.
template <typename Load, typename Check>
std::vector<CheckpointStatus> ScanSteps(const std::vector<StepName>& dirs, Load&& load,
                                        Check&& check) {
  std::vector<CheckpointStatus> out;
  out.reserve(dirs.size());
  for (const StepName& d : dirs) {
    CheckpointStatus cs;
    cs.info.step = d.step;
    cs.info.path = d.path;
    auto loaded = load(d);
    if (!loaded.ok()) {
      cs.status = loaded.status();
    } else {
      cs.info = loaded->m.Info();
      cs.status = check(*loaded);
    }
    out.push_back(std::move(cs));
  }
  return out;
}

}  // namespace omni::ckpt
