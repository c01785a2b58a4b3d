#include "ckpt/step_dirs.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace omni::ckpt {

std::string Join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : absl::StrCat(dir, "/", name);
}

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012" PRId64, step);
  return buf;
}

std::optional<int64_t> ParseStepDir(std::string_view name) {
  if (name.size() != 17 || name.substr(0, 5) != "step-") return std::nullopt;
  int64_t v = 0;
  for (const char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

absl::Status CheckStepMatchesDirName(const std::string& dir_path, const std::string& manifest_path,
                                     int64_t step) {
  const std::string base = std::filesystem::path(dir_path).filename().string();
  const std::optional<int64_t> dir_step = ParseStepDir(base);
  if (dir_step && *dir_step != step) {
    return absl::DataLossError(
        absl::StrCat(manifest_path, ": step ", step, " does not match the directory name ", base));
  }
  return absl::OkStatus();
}

std::string TrimTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string PartialLoadNote(const std::string& partial) {
  return partial.empty() ? std::string()
                         : absl::StrCat("; the state objects may have been partially loaded from ",
                                        partial, " and hold an unspecified state");
}

absl::Status NoValidCheckpoint(const std::string& dir, const std::vector<std::string>& skipped,
                               const std::string& partial, size_t candidates, bool start_fresh,
                               const char* fresh_option) {
  std::string msg = absl::StrCat("no valid checkpoint in ", dir);
  if (!skipped.empty()) absl::StrAppend(&msg, " (", absl::StrJoin(skipped, "; "), ")");
  if (!partial.empty()) return absl::DataLossError(absl::StrCat(msg, PartialLoadNote(partial)));
  if (candidates > 0 && !start_fresh) {
    return absl::FailedPreconditionError(absl::StrCat(
        msg, "; it holds ", candidates, " checkpoint director", candidates == 1 ? "y" : "ies",
        " but none is valid: refusing to start from scratch (repair or move them, or start "
        "fresh explicitly: ",
        fresh_option, ", omni_train --start-fresh)"));
  }
  return absl::NotFoundError(msg);
}

absl::StatusOr<std::vector<StepName>> StepDirs(internal::FileSystem& fs, int dir,
                                               const std::string& path) {
  absl::StatusOr<std::vector<internal::DirEntry>> entries = fs.List(dir, path);
  if (!entries.ok()) return entries.status();
  std::vector<StepName> out;
  for (const internal::DirEntry& e : *entries) {
    if (std::optional<int64_t> s = ParseStepDir(e.name)) {
      out.push_back({*s, e.name, Join(path, e.name)});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StepName& a, const StepName& b) { return a.step > b.step; });
  return out;
}

absl::StatusOr<std::string> ReadManifestAt(internal::FileSystem& fs, int dir,
                                           const std::string& step_path) {
  constexpr const char* kName = "manifest.json";
  absl::StatusOr<std::string> text = internal::ReadFileAt(fs, dir, kName, Join(step_path, kName),
                                                          CheckpointManager::kMaxManifestBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat(step_path, ": no manifest.json (not a checkpoint)"));
  }
  return text;
}

}  // namespace omni::ckpt
