// omni._C preemption: PreemptionMonitor (over omni::PreemptionMonitor) and
// the preemption exit codes.

#include "omni/preemption.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common.h"
#include "options.h"
#include "store.h"

namespace omni_python {
namespace {

const char* BoundaryActionName(omni::BoundaryAction action) {
  switch (action) {
    case omni::BoundaryAction::kContinue:
      return "continue";
    case omni::BoundaryAction::kSaveAndExit:
      return "save_and_exit";
    case omni::BoundaryAction::kExitWithoutSave:
      return "exit_without_save";
  }
  return "continue";
}

class PyPreemptionMonitor final : public Closeable {
 public:
  // Options: the visited ones plus signals (None or a list of ints),
  // notice_store (an omni.Store, with notice_key), apply_environment
  // (default True) and clock (None or an omni.FakeClock).
  static std::unique_ptr<PyPreemptionMonitor> Create(const py::kwargs& kwargs) {
    omni::PreemptionOptions options;
    KwargsReader reader(kwargs);
    VisitPreemptionOptions(options, reader);
    if (py::handle s = reader.Take("signals"); s && !s.is_none()) {
      options.signals.clear();
      for (py::handle sig : py::iter(s)) {
        if (PyBool_Check(sig.ptr()) || !py::hasattr(sig, "__index__")) {
          throw py::type_error(absl::StrCat("signals must be ints, got ", TypeName(sig)));
        }
        options.signals.push_back(
            py::reinterpret_borrow<py::int_>(py::module_::import("operator").attr("index")(sig))
                .cast<int>());
      }
    }
    py::object store_obj = py::none();
    if (py::handle st = reader.Take("notice_store"); st && !st.is_none()) {
      if (!py::isinstance<PyStore>(st)) {
        throw py::type_error(
            absl::StrCat("notice_store must be None or omni.Store, got ", TypeName(st)));
      }
      store_obj = py::reinterpret_borrow<py::object>(st);
      options.notice_store = &store_obj.cast<PyStore&>().store();
    }
    bool apply_environment = true;
    reader.Bool("apply_environment", &apply_environment);
    py::object clock_obj = py::none();
    if (py::handle c = reader.Take("clock")) clock_obj = py::reinterpret_borrow<py::object>(c);
    reader.CheckAllUsed("PreemptionMonitor");
    if (apply_environment) ThrowIfError(omni::ApplyEnvironment(options));
    const omni::Clock* clock = ClockArg(clock_obj);
    absl::StatusOr<std::unique_ptr<omni::PreemptionMonitor>> monitor;
    {
      py::gil_scoped_release release;
      monitor = omni::PreemptionMonitor::Create(options, clock);
    }
    return std::make_unique<PyPreemptionMonitor>(
        std::move(clock_obj), std::move(store_obj), clock, ValueOrThrow(std::move(monitor)),
        NanosToSeconds(absl::ToInt64Nanoseconds(options.grace)));
  }
  // Use Create().
  PyPreemptionMonitor(py::object clock_obj, py::object store_obj, const omni::Clock* clock,
                      std::unique_ptr<omni::PreemptionMonitor> monitor, double grace_s)
      : clock_obj_(std::move(clock_obj)),
        store_obj_(std::move(store_obj)),
        clock_(clock),
        monitor_(std::move(monitor)),
        grace_s_(grace_s) {}
  ~PyPreemptionMonitor() override { CloseOnDestruction(); }
  PyPreemptionMonitor(const PyPreemptionMonitor&) = delete;
  PyPreemptionMonitor& operator=(const PyPreemptionMonitor&) = delete;

  py::tuple AtBoundary(double step_mean_s, double step_stddev_s, double save_mean_s,
                       double save_stddev_s) {
    const omni::BoundaryDecision d =
        monitor().AtBoundary({step_mean_s, step_stddev_s}, {save_mean_s, save_stddev_s});
    return py::make_tuple(BoundaryActionName(d.action), d.reason, d.deadline_ns);
  }
  void Notice(int64_t deadline_ns) { monitor().Notice(deadline_ns); }
  bool pending() { return monitor().pending(); }
  int signals_received() { return monitor().signals_received(); }
  std::optional<std::string> last_notice_error() {
    const absl::Status status = monitor().last_notice_error();
    if (status.ok()) return std::nullopt;
    return std::string(status.message());
  }
  int64_t NowNs() const { return clock_->NowNanos(); }
  double grace_s() const { return grace_s_; }

  // Restores the previous signal handlers and joins the watcher thread.
  void Close() {
    if (monitor_ == nullptr) return;
    py::gil_scoped_release release;
    monitor_.reset();
  }
  bool closed() const { return monitor_ == nullptr; }
  void CloseQuietly() override { Close(); }

 private:
  omni::PreemptionMonitor& monitor() const {
    if (monitor_ == nullptr) throw std::runtime_error("the PreemptionMonitor is closed");
    return *monitor_;
  }
  py::object clock_obj_;  // keeps a FakeClock alive while the monitor reads it
  py::object store_obj_;  // keeps the notice store alive while the monitor polls it
  const omni::Clock* clock_;
  std::unique_ptr<omni::PreemptionMonitor> monitor_;
  double grace_s_;
};

}  // namespace

void DefinePreemption(py::module_& m) {
  m.attr("EXIT_PREEMPTED") = omni::kExitPreempted;
  m.attr("EXIT_PREEMPTED_NO_SAVE") = omni::kExitPreemptedNoSave;
  m.def(
      "default_preemption_options",
      [] {
        py::dict d = DefaultsDict<omni::PreemptionOptions>(
            [](omni::PreemptionOptions& o, DictWriter& w) { VisitPreemptionOptions(o, w); });
        d["signals"] = omni::PreemptionOptions().signals;
        d["notice_store"] = py::none();
        d["apply_environment"] = true;
        d["clock"] = py::none();
        return d;
      },
      "The keyword options of PreemptionMonitor(...) and their defaults.");
  py::class_<PyPreemptionMonitor>(m, "PreemptionMonitor",
                                  "Signals and notices acted upon at step boundaries.")
      .def(py::init([](const py::kwargs& kwargs) { return PyPreemptionMonitor::Create(kwargs); }))
      .def("at_boundary", &PyPreemptionMonitor::AtBoundary, py::arg("next_step_mean_s"),
           py::arg("next_step_stddev_s") = 0.0, py::arg("save_mean_s") = 0.0,
           py::arg("save_stddev_s") = 0.0)
      .def("notice", &PyPreemptionMonitor::Notice, py::arg("deadline_ns"))
      .def("now_ns", &PyPreemptionMonitor::NowNs)
      .def_property_readonly("pending", &PyPreemptionMonitor::pending)
      .def_property_readonly("signals_received", &PyPreemptionMonitor::signals_received)
      .def_property_readonly("last_notice_error", &PyPreemptionMonitor::last_notice_error)
      .def_property_readonly("grace_s", &PyPreemptionMonitor::grace_s)
      .def("close", &PyPreemptionMonitor::Close)
      .def_property_readonly("closed", &PyPreemptionMonitor::closed);
}

}  // namespace omni_python
