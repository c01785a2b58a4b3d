// omni._C checkpoints: CheckpointManager (over omni::CheckpointManager) with
// Python state objects, and the module-level list / scan / verify / describe.

#include "omni/checkpoint.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common.h"
#include "state.h"

namespace omni_python {
namespace {

// The keyword options of CheckpointManager(dir, ...), in Python units.
template <typename Visitor>
void VisitCheckpointOptions(omni::CheckpointOptions& o, Visitor& v) {
  v.Int("rank", &o.rank);
  v.Int("world_size", &o.world_size);
  v.Str("job_id", &o.job_id);
  v.Int("keep_last", &o.keep_last);
  v.Int("keep_every", &o.keep_every);
  v.Int("max_snapshot_bytes", &o.max_snapshot_bytes);
  v.Bool("keep_snapshot_memory", &o.keep_snapshot_memory);
  v.Bool("wait_for_pending", &o.wait_for_pending);
  v.Bool("start_fresh", &o.start_fresh);
  v.Bool("direct_io", &o.direct_io);
  v.Bool("read_only", &o.read_only);
  v.Duration("shard_timeout_s", &o.shard_timeout);
}

py::dict InfoDict(const omni::CheckpointInfo& info) {
  py::dict d;
  d["step"] = info.step;
  d["path"] = info.path;
  d["world_size"] = info.world_size;
  d["format_version"] = info.format_version;
  d["library_version"] = info.library_version;
  d["job_id"] = info.job_id;
  d["bytes"] = info.bytes;
  d["created_unix_ms"] = info.created_unix_ms;
  d["metadata"] = info.metadata;
  return d;
}

py::list InfoList(const std::vector<omni::CheckpointInfo>& infos) {
  py::list list;
  for (const omni::CheckpointInfo& info : infos) list.append(InfoDict(info));
  return list;
}

py::dict SaveStatsDict(const omni::SaveStats& s) {
  py::dict d;
  d["bytes"] = s.bytes;
  d["snapshot_s"] = s.snapshot_s;
  d["write_s"] = s.write_s;
  d["background"] = s.background;
  d["skipped"] = s.skipped;
  return d;
}

using Metadata = std::map<std::string, std::string>;

class PyCheckpointManager final : public Closeable {
 public:
  static std::unique_ptr<PyCheckpointManager> Open(py::handle dir, const py::kwargs& kwargs) {
    omni::CheckpointOptions options;
    options.dir = PathArg("dir", dir);
    KwargsReader reader(kwargs);
    VisitCheckpointOptions(options, reader);
    reader.CheckAllUsed("CheckpointManager");
    absl::StatusOr<std::unique_ptr<omni::CheckpointManager>> manager;
    {
      py::gil_scoped_release release;
      manager = omni::CheckpointManager::Open(options);
    }
    return std::make_unique<PyCheckpointManager>(options.dir, ValueOrThrow(std::move(manager)));
  }

  // Use Open().
  PyCheckpointManager(std::string dir, std::unique_ptr<omni::CheckpointManager> manager)
      : dir_(std::move(dir)), manager_(std::move(manager)) {}
  ~PyCheckpointManager() override { CloseOnDestruction(); }
  PyCheckpointManager(const PyCheckpointManager&) = delete;
  PyCheckpointManager& operator=(const PyCheckpointManager&) = delete;

  py::dict Save(int64_t step, PyStateRegistry& state, const std::optional<Metadata>& metadata,
                bool async) {
    omni::CheckpointManager& m = manager();
    state.ClearError();
    const Metadata meta = metadata.value_or(Metadata());
    absl::StatusOr<omni::SaveStats> stats;
    {
      py::gil_scoped_release release;  // Python state objects take it back
      stats =
          async ? m.SaveAsync(step, state.registry(), meta) : m.Save(step, state.registry(), meta);
    }
    if (!stats.ok()) state.Raise(stats.status());
    return SaveStatsDict(*stats);
  }

  void WaitForPending(std::optional<double> timeout_s) {
    omni::CheckpointManager& m = manager();
    const absl::Duration timeout = timeout_s
                                       ? absl::Nanoseconds(SecondsToNanos("timeout_s", *timeout_s))
                                       : absl::InfiniteDuration();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = m.WaitForPending(timeout);
    }
    ThrowIfError(status);
  }

  py::list List() {
    omni::CheckpointManager& m = manager();
    absl::StatusOr<std::vector<omni::CheckpointInfo>> infos;
    {
      py::gil_scoped_release release;
      infos = m.List();
    }
    return InfoList(ValueOrThrow(std::move(infos)));
  }

  // None when there is no checkpoint at all (and no `step` was asked for).
  py::object Restore(PyStateRegistry& state, std::optional<int64_t> step) {
    omni::CheckpointManager& m = manager();
    state.ClearError();
    absl::StatusOr<omni::CheckpointManager::RestoreResult> result;
    bool none_at_all = false;
    {
      py::gil_scoped_release release;
      result = m.Restore(state.registry(), step);
      if (absl::IsNotFound(result.status()) && !step) {
        absl::StatusOr<std::vector<omni::CheckpointInfo>> infos = m.List();
        none_at_all = infos.ok() && infos->empty();
      }
    }
    if (!result.ok()) {
      if (none_at_all) {
        state.ClearError();
        return py::none();
      }
      state.Raise(result.status());
    }
    py::dict d = InfoDict(result->info);
    d["skipped"] = result->skipped;
    return d;
  }

  void Close() {
    if (manager_ == nullptr) return;
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = manager_->WaitForPending();
      manager_.reset();  // joins the writer thread; releases the lock
    }
    ThrowIfError(status);
  }
  void CloseQuietly() override {
    if (manager_ == nullptr) return;
    py::gil_scoped_release release;
    manager_->WaitForPending().IgnoreError();
    manager_.reset();
  }
  bool closed() const { return manager_ == nullptr; }
  const std::string& dir() const { return dir_; }

 private:
  omni::CheckpointManager& manager() const {
    if (manager_ == nullptr) {
      throw std::runtime_error(absl::StrCat("the CheckpointManager of ", dir_, " is closed"));
    }
    return *manager_;
  }
  std::string dir_;
  std::unique_ptr<omni::CheckpointManager> manager_;
};

py::list ListCheckpoints(py::handle dir_arg) {
  const std::string dir = PathArg("dir", dir_arg);
  absl::StatusOr<std::vector<omni::CheckpointInfo>> infos;
  {
    py::gil_scoped_release release;
    infos = omni::ListCheckpoints(dir);
  }
  return InfoList(ValueOrThrow(std::move(infos)));
}

py::list ScanCheckpoints(py::handle dir_arg) {
  const std::string dir = PathArg("dir", dir_arg);
  absl::StatusOr<std::vector<omni::CheckpointStatus>> scanned;
  {
    py::gil_scoped_release release;
    scanned = omni::ScanCheckpoints(dir);
  }
  py::list list;
  for (const omni::CheckpointStatus& s : ValueOrThrow(std::move(scanned))) {
    py::dict d = InfoDict(s.info);
    d["valid"] = s.status.ok();
    d["error"] = s.status.ok() ? py::object(py::none()) : py::object(py::str(s.status.ToString()));
    list.append(d);
  }
  return list;
}

void VerifyCheckpoint(py::handle path_arg) {
  const std::string path = PathArg("path", path_arg);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = omni::VerifyCheckpoint(path);
  }
  ThrowIfError(status);
}

std::string DescribeCheckpoint(py::handle path_arg) {
  const std::string path = PathArg("path", path_arg);
  absl::StatusOr<std::string> text;
  {
    py::gil_scoped_release release;
    text = omni::DescribeCheckpoint(path);
  }
  return ValueOrThrow(std::move(text));
}

}  // namespace

void DefineCheckpoints(py::module_& m) {
  m.def(
      "default_checkpoint_options",
      [] {
        return DefaultsDict<omni::CheckpointOptions>(
            [](omni::CheckpointOptions& o, DictWriter& w) { VisitCheckpointOptions(o, w); });
      },
      "The keyword options of CheckpointManager(dir, ...) and their defaults.");
  py::class_<PyCheckpointManager>(m, "CheckpointManager",
                                  "Checkpoints of one rank; see omni.CheckpointManager.")
      .def(py::init([](py::handle dir, const py::kwargs& kwargs) {
             return PyCheckpointManager::Open(dir, kwargs);
           }),
           py::arg("dir"))
      .def(
          "save",
          [](PyCheckpointManager& self, int64_t step, PyStateRegistry& state,
             const std::optional<Metadata>& metadata) {
            return self.Save(step, state, metadata, /*async=*/false);
          },
          py::arg("step"), py::arg("state"), py::arg("metadata") = py::none())
      .def(
          "save_async",
          [](PyCheckpointManager& self, int64_t step, PyStateRegistry& state,
             const std::optional<Metadata>& metadata) {
            return self.Save(step, state, metadata, /*async=*/true);
          },
          py::arg("step"), py::arg("state"), py::arg("metadata") = py::none())
      .def("wait_for_pending", &PyCheckpointManager::WaitForPending,
           py::arg("timeout_s") = py::none())
      .def("list", &PyCheckpointManager::List)
      .def("restore", &PyCheckpointManager::Restore, py::arg("state"), py::arg("step") = py::none())
      .def("close", &PyCheckpointManager::Close)
      .def_property_readonly("closed", &PyCheckpointManager::closed)
      .def_property_readonly("dir", &PyCheckpointManager::dir);

  m.def("list_checkpoints", &ListCheckpoints, py::arg("dir"),
        "Every valid checkpoint under `dir`, newest first.");
  m.def("scan_checkpoints", &ScanCheckpoints, py::arg("dir"),
        "Every step directory under `dir`, newest first, valid or not (with the reason).");
  m.def("verify_checkpoint", &VerifyCheckpoint, py::arg("path"),
        "Verifies every checksum of the checkpoint at `path`; raises at the first mismatch.");
  m.def("describe_checkpoint", &DescribeCheckpoint, py::arg("path"),
        "A human-readable description of the checkpoint at `path`.");
}

}  // namespace omni_python
