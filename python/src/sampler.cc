// omni._C sampler: DistributedSampler (omni::DistributedSampler), a
// resumable, deterministic distributed sampler whose cursor is state.

#include "omni/sampler.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common.h"
#include "options.h"
#include "state.h"

namespace omni_python {
namespace {

void CheckCursor(int64_t epoch, int64_t offset) {
  if (epoch < 0 || offset < 0) {
    throw py::value_error(
        absl::StrCat("cursor must not be negative, got (", epoch, ", ", offset, ")"));
  }
}

py::tuple CursorTuple(const omni::SamplerCursor& c) { return py::make_tuple(c.epoch, c.offset); }

}  // namespace

void DefineSampler(py::module_& m) {
  m.def(
      "default_sampler_options",
      [] {
        return DefaultsDict<omni::SamplerOptions>(
            [](omni::SamplerOptions& o, DictWriter& w) { VisitSamplerOptions(o, w); });
      },
      "The keyword options of DistributedSampler(dataset_size, ...) and their defaults.");
  py::class_<omni::DistributedSampler>(m, "DistributedSampler",
                                       "A resumable, deterministic distributed sampler.")
      .def(py::init([](int64_t dataset_size, const py::kwargs& kwargs) {
             omni::SamplerOptions options;
             options.dataset_size = dataset_size;
             KwargsReader reader(kwargs);
             VisitSamplerOptions(options, reader);
             reader.CheckAllUsed("DistributedSampler");
             return ValueOrThrow(omni::DistributedSampler::Create(options));
           }),
           py::arg("dataset_size"))
      .def(
          "batch",
          [](const omni::DistributedSampler& s, int replica, int num_replicas) {
            return ValueOrThrow(s.Batch(replica, num_replicas));
          },
          py::arg("replica") = 0, py::arg("num_replicas") = 1)
      .def(
          "batch_at",
          [](const omni::DistributedSampler& s, int64_t epoch, int64_t offset, int replica,
             int num_replicas) {
            CheckCursor(epoch, offset);
            return ValueOrThrow(s.BatchAt({epoch, offset}, replica, num_replicas));
          },
          py::arg("epoch"), py::arg("offset"), py::arg("replica") = 0, py::arg("num_replicas") = 1)
      .def(
          "next_cursor",
          [](const omni::DistributedSampler& s, int64_t epoch, int64_t offset) {
            CheckCursor(epoch, offset);
            return CursorTuple(s.Next({epoch, offset}));
          },
          py::arg("epoch"), py::arg("offset"))
      .def("commit", &omni::DistributedSampler::Commit)
      .def_property_readonly(
          "cursor", [](const omni::DistributedSampler& s) { return CursorTuple(s.cursor()); })
      .def_property_readonly("batches_per_epoch", &omni::DistributedSampler::batches_per_epoch)
      .def(
          "index_at",
          [](const omni::DistributedSampler& s, int64_t epoch, int64_t i) {
            if (epoch < 0) throw py::value_error(absl::StrCat("epoch must be >= 0, got ", epoch));
            if (i < 0 || i >= s.options().dataset_size) {
              throw py::value_error(
                  absl::StrCat("i must be in [0, ", s.options().dataset_size, "), got ", i));
            }
            return s.IndexAt(epoch, i);
          },
          py::arg("epoch"), py::arg("i"))
      .def_property_readonly("options",
                             [](const omni::DistributedSampler& s) {
                               const omni::SamplerOptions& o = s.options();
                               py::dict d;
                               d["dataset_size"] = o.dataset_size;
                               d["global_batch"] = o.global_batch;
                               d["seed"] = o.seed;
                               d["shuffle"] = o.shuffle;
                               d["drop_last"] = o.drop_last;
                               return d;
                             })
      .def(
          "save",
          [](const omni::DistributedSampler& s, PyStateWriter& w) {
            ThrowIfError(s.Save(w.writer()));
          },
          py::arg("writer"), "Saves the cursor (for use inside another object's save()).")
      .def(
          "load",
          [](omni::DistributedSampler& s, PyStateReader& r) { ThrowIfError(s.Load(r.reader())); },
          py::arg("reader"), "Loads the cursor (for use inside another object's load()).");
}

}  // namespace omni_python
