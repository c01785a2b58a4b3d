// omni._C telemetry: Telemetry (over omni::Telemetry), step logs, the
// evaluator, and the small helpers around them (pipeline bubble, NCCL probe).
//
// The per-step hooks never block or lock (telemetry.h) and keep the GIL;
// every other call that may lock runs with the GIL released, because the
// telemetry worker takes the GIL to call Python callback sinks.

#include "omni/telemetry.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common.h"
#include "omni/evaluator.h"
#include "omni/forecast.h"
#include "omni/nccl.h"
#include "omni/phase.h"
#include "omni/sinks.h"
#include "omni/stats.h"
#include "omni/step_log.h"
#include "options.h"
#include "store.h"

namespace omni_python {
namespace {

// ---------------------------------------------------------------- options

// Options handled outside TelemetryOptions.
constexpr const char* kForecastFileOption = "forecast_file";
constexpr const char* kClockOption = "clock";

// Reads options out of **kwargs; TypeError for an unknown name or a value of

py::dict DefaultTelemetryOptions() {
  omni::TelemetryOptions options;
  DictWriter writer;
  VisitTelemetryOptions(options, writer);
  writer.dict()[kForecastFileOption] = py::none();
  writer.dict()[kClockOption] = py::none();
  return writer.dict();
}

// ---------------------------------------------------------------- dicts

py::dict ForecastDict(const omni::Forecast& forecast) {
  return JsonLoads(omni::ForecastToJson(forecast));
}

py::list PhaseList(const omni::PhaseCatalog& catalog) {
  py::list phases;
  for (int i = 0; i < catalog.size(); ++i) {
    const auto id = static_cast<omni::PhaseId>(i);
    py::dict phase;
    phase["id"] = i;
    phase["name"] = catalog.name(id);
    phase["idle"] = std::string(omni::IdleKindName(catalog.idle_kind(id)));
    phases.append(phase);
  }
  return phases;
}

py::dict EventDict(const omni::PeriodicEvent& event) {
  py::dict d;
  d["every"] = event.every_steps;
  d["offset"] = event.offset;
  d["expected_s"] = NanosToSeconds(event.expected_ns);
  d["every_s"] = NanosToSeconds(event.every_ns);
  d["wall_lag_steps"] = event.wall_lag_steps;
  return d;
}

py::dict PipelineDict(const omni::PipelineSchedule& p) {
  py::dict d;
  d["stages"] = p.stages;
  d["micro_batches"] = p.micro_batches;
  d["stage"] = p.stage;
  d["backward_over_forward"] = p.backward_over_forward;
  return d;
}

py::dict CountersDict(const omni::TelemetryCounters& c) {
  py::dict d;
  d["steps_recorded"] = c.steps_recorded;
  d["steps_dropped"] = c.steps_dropped;
  d["steps_not_forecast"] = c.steps_not_forecast;
  d["misuse_errors"] = c.misuse_errors;
  d["spans_truncated"] = c.spans_truncated;
  d["steps_rejected"] = c.steps_rejected;
  d["forecasts_published"] = c.forecasts_published;
  d["worker_wakeups"] = c.worker_wakeups;
  d["export_errors"] = c.export_errors;
  d["previous_steps_learned"] = c.previous_steps_learned;
  d["previous_log_status"] =
      c.previous_log_status.ok() ? std::string() : c.previous_log_status.ToString();
  d["last_error"] = c.last_error.ok() ? std::string() : c.last_error.ToString();
  return d;
}

// A sink calling `fn(forecast_dict)` on the telemetry worker thread. Whatever
// `fn` raises becomes the publish Status (counted by the telemetry).
std::unique_ptr<omni::ForecastSink> MakePythonCallbackSink(py::object fn, std::string name) {
  auto owned = std::make_shared<GilOwned>(std::move(fn));
  auto call = [owned](const omni::Forecast& forecast) -> absl::Status {
    py::gil_scoped_acquire gil;
    try {
      owned->get()(ForecastDict(forecast));
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return absl::UnknownError(absl::StrCat("Python callback raised ", e.what()));
    } catch (const std::exception& e) {
      return absl::UnknownError(absl::StrCat("Python callback failed: ", e.what()));
    } catch (...) {
      return absl::UnknownError("Python callback failed with an unknown C++ exception");
    }
  };
  return omni::MakeCallbackSink(std::move(call), std::move(name));
}

// ---------------------------------------------------------------- Telemetry

class PyTelemetry final : public Closeable {
 public:
  static std::unique_ptr<PyTelemetry> Create(const py::kwargs& kwargs) {
    omni::TelemetryOptions options;
    KwargsReader reader(kwargs);
    VisitTelemetryOptions(options, reader);
    std::string forecast_file;
    reader.Path(kForecastFileOption, &forecast_file);
    py::object clock_obj = py::none();
    if (py::handle c = reader.Take(kClockOption)) clock_obj = py::reinterpret_borrow<py::object>(c);
    reader.CheckAllUsed("Telemetry");

    const omni::Clock* clock = ClockArg(clock_obj);

    // The file sink first: a bad forecast_file then leaves no step log or
    // trace file behind.
    absl::Status sink_status;
    absl::StatusOr<std::unique_ptr<omni::Telemetry>> telemetry;
    {
      py::gil_scoped_release release;  // creates and opens files
      std::unique_ptr<omni::ForecastSink> sink;
      if (!forecast_file.empty()) {
        absl::StatusOr<std::unique_ptr<omni::ForecastSink>> made =
            omni::MakeFileSink(forecast_file);
        if (made.ok()) {
          sink = *std::move(made);
        } else {
          sink_status = made.status();
        }
      }
      if (sink_status.ok()) {
        telemetry = omni::Telemetry::Create(options, clock);
        if (telemetry.ok() && sink != nullptr) (*telemetry)->AddSink(std::move(sink));
      }
    }
    ThrowIfError(sink_status);
    ThrowIfError(telemetry.status());
    return std::make_unique<PyTelemetry>(std::move(clock_obj), *std::move(telemetry));
  }

  // Use Create().
  PyTelemetry(py::object clock, std::unique_ptr<omni::Telemetry> telemetry)
      : clock_(std::move(clock)), owned_(std::move(telemetry)), telemetry_(owned_.get()) {}
  // A view of a telemetry that `owner` (an omni.Runtime) owns: every call
  // raises RuntimeError once *alive is false; close() belongs to the owner.
  PyTelemetry(py::object owner, omni::Telemetry* borrowed, std::shared_ptr<const bool> alive)
      : clock_(std::move(owner)), telemetry_(borrowed), alive_(std::move(alive)) {}

  ~PyTelemetry() override {
    CloseOnDestruction();  // joins the worker, so nothing below waits for it
    owned_.reset();
  }
  PyTelemetry(const PyTelemetry&) = delete;
  PyTelemetry& operator=(const PyTelemetry&) = delete;

  omni::PhaseId RegisterPhase(const std::string& name, const std::string& idle) {
    const omni::IdleKind kind = ValueOrThrow(omni::ParseIdleKind(idle));
    absl::StatusOr<omni::PhaseId> id;
    {
      py::gil_scoped_release release;
      id = tel().RegisterPhase(name, kind);
    }
    const omni::PhaseId result = ValueOrThrow(std::move(id));
    phase_ids_[name] = result;
    return result;
  }

  std::optional<int> FindPhase(const std::string& name) {
    if (auto it = phase_ids_.find(name); it != phase_ids_.end()) return it->second;
    absl::StatusOr<omni::PhaseId> id;
    {
      py::gil_scoped_release release;
      id = tel().FindPhase(name);
    }
    if (absl::IsNotFound(id.status())) return std::nullopt;
    const omni::PhaseId result = ValueOrThrow(std::move(id));
    phase_ids_[name] = result;
    return result;
  }

  py::list Phases() const {
    omni::PhaseCatalog catalog;
    {
      py::gil_scoped_release release;
      catalog = tel().Phases();
    }
    return PhaseList(catalog);
  }

  void AddCallbackSink(py::object fn, std::string name) {
    if (!PyCallable_Check(fn.ptr())) {
      throw py::type_error(absl::StrCat("callback sink must be callable, got ", TypeName(fn)));
    }
    auto sink = MakePythonCallbackSink(std::move(fn), std::move(name));
    py::gil_scoped_release release;
    tel().AddSink(std::move(sink));
  }

  // The store sink (omni/sinks.h): forecasts, window notices and the outlook
  // under `prefix` in `store`, for guests on other hosts. The binding keeps
  // the store alive as long as this telemetry.
  void AddStoreSink(PyStore& store, const std::string& prefix) {
    auto sink = ValueOrThrow(omni::MakeStoreSink(store.store(), prefix));
    py::gil_scoped_release release;
    tel().AddSink(std::move(sink));
  }

  // ---- per-step hooks.
  void BeginStep(std::optional<int64_t> step) {
    ThrowIfError(CallHook([&] { return step ? tel().BeginStep(*step) : tel().BeginStep(); }));
  }
  void EndStep() {
    ThrowIfError(CallHook([&] { return tel().EndStep(); }));
  }
  void BeginPhase(py::handle phase) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return tel().BeginPhase(id); }));
  }
  void EndPhase(py::handle phase) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return tel().EndPhase(id); }));
  }
  void EndPhaseAs(py::handle phase, py::handle recorded_as) {
    const omni::PhaseId id = ResolvePhase(phase);
    const omni::PhaseId as = ResolvePhase(recorded_as);
    ThrowIfError(CallHook([&] { return tel().EndPhaseAs(id, as); }));
  }
  void RecordPhase(py::handle phase, double seconds) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return tel().RecordPhase(id, seconds); }));
  }

  // ---- any thread
  void Flush(double timeout_s) {
    const int64_t timeout_ns = SecondsToNanos("timeout_s", timeout_s);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = tel().Flush(absl::Nanoseconds(timeout_ns));
    }
    ThrowIfError(status);
  }

  omni::StatsSnapshot Snapshot() const {
    py::gil_scoped_release release;
    return tel().Snapshot();
  }

  py::object LatestForecast() const {
    absl::StatusOr<omni::Forecast> forecast;
    {
      py::gil_scoped_release release;
      forecast = tel().LatestForecast();
    }
    if (absl::IsFailedPrecondition(forecast.status())) return py::none();
    return ForecastDict(ValueOrThrow(std::move(forecast)));
  }

  void AnnounceBusy(int64_t until_ns) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = tel().AnnounceBusy(until_ns);
    }
    ThrowIfError(status);
  }

  py::dict LatestOutlook() const {
    omni::WindowOutlook outlook;
    {
      py::gil_scoped_release release;
      outlook = tel().LatestOutlook();
    }
    return OutlookDict(outlook);
  }

  py::dict Counters() const {
    omni::TelemetryCounters counters;
    {
      py::gil_scoped_release release;
      counters = tel().Counters();
    }
    return CountersDict(counters);
  }

  // The forecast options in effect (the forecaster is immutable).
  py::dict Options() const {
    const omni::ForecastOptions& forecast = tel().forecaster().options();
    py::dict d;
    d["horizon_s"] = NanosToSeconds(forecast.horizon_ns);
    d["k"] = forecast.k;
    d["min_window_s"] = NanosToSeconds(forecast.min_window_ns);
    d["checkpoint"] = EventDict(forecast.checkpoint);
    d["eval"] = EventDict(forecast.eval);
    d["pipeline"] = PipelineDict(forecast.pipeline);
    return d;
  }

  void Close() {
    if (alive_ != nullptr) {
      throw std::runtime_error(
          "this telemetry belongs to an omni.Runtime: close the Runtime instead");
    }
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = tel().Close();
    }
    closed_ = true;
    ThrowIfError(status);
  }

  // Close() without raising; for interpreter exit and destruction.
  void CloseQuietly() override {
    if (closed_ || alive_ != nullptr) return;  // a view: the owner closes it
    closed_ = true;
    py::gil_scoped_release release;
    tel().Close().IgnoreError();
  }

  bool closed() const { return alive_ != nullptr ? !*alive_ : closed_; }

 private:
  omni::Telemetry& tel() const {
    if (alive_ != nullptr && !*alive_) {
      throw std::runtime_error("the omni.Runtime that owned this telemetry is closed");
    }
    return *telemetry_;
  }

  template <typename Hook>
  // The hooks keep the GIL: the core publishes to sinks without holding the
  // lock the hooks' error path takes, so a Python sink waiting for the GIL on
  // the worker thread never blocks a hook.
  absl::Status CallHook(const Hook& hook) {
    return hook();
  }

  // A phase given as an int id or a registered name. Unknown ids and names are
  // ValueError (InvalidArgument), like the hooks' own unknown-phase errors.
  omni::PhaseId ResolvePhase(py::handle phase) {
    if (PyLong_Check(phase.ptr()) && !PyBool_Check(phase.ptr())) {
      int overflow = 0;
      const long long id = PyLong_AsLongLongAndOverflow(phase.ptr(), &overflow);
      if (overflow != 0 || id < 0 || id >= omni::kMaxPhases) {
        throw py::value_error(absl::StrCat("unknown phase id ", py::repr(phase).cast<std::string>(),
                                           " (ids are 0..", omni::kMaxPhases - 1, ")"));
      }
      return static_cast<omni::PhaseId>(id);
    }
    if (PyUnicode_Check(phase.ptr())) {
      const std::string name = phase.cast<std::string>();
      if (auto it = phase_ids_.find(name); it != phase_ids_.end()) return it->second;
      absl::StatusOr<omni::PhaseId> id;
      {
        py::gil_scoped_release release;
        id = tel().FindPhase(name);
      }
      if (absl::IsNotFound(id.status())) {
        RaiseStatus(absl::InvalidArgumentError(id.status().message()));
      }
      const omni::PhaseId result = ValueOrThrow(std::move(id));
      phase_ids_[name] = result;
      return result;
    }
    throw py::type_error(
        absl::StrCat("phase must be an int id or a str name, got ", TypeName(phase)));
  }

  // Declared before telemetry_ so that it outlives it: the telemetry reads
  // the FakeClock (if any) until it is destroyed.
  py::object clock_;                        // the FakeClock in use, or a view's owner (kept alive)
  std::unique_ptr<omni::Telemetry> owned_;  // null for a view
  omni::Telemetry* telemetry_;
  std::shared_ptr<const bool> alive_;  // a view's owner is open; null when owned
  std::unordered_map<std::string, omni::PhaseId> phase_ids_;  // resolved names
  bool closed_ = false;
};

// ---------------------------------------------------------------- step logs

py::dict StepLogSummary(const std::string& path, const omni::StepLog& log) {
  py::dict d;
  d["path"] = path;
  d["version"] = log.header.version;
  d["source"] = log.header.source;
  d["phases"] = PhaseList(log.header.phases);
  d["checkpoint"] = EventDict(log.header.checkpoint);
  d["eval"] = EventDict(log.header.eval);
  d["pipeline"] = PipelineDict(log.header.pipeline);
  d["steps"] = static_cast<int64_t>(log.steps.size());
  d["unfinished_tail_bytes"] = static_cast<int64_t>(log.unfinished_tail_bytes);
  if (log.steps.empty()) {
    d["first_step"] = py::none();
    d["last_step"] = py::none();
    d["duration_s"] = 0.0;
  } else {
    d["first_step"] = log.steps.front().step;
    d["last_step"] = log.steps.back().step;
    d["duration_s"] = NanosToSeconds(log.steps.back().end_ns - log.steps.front().start_ns);
  }
  return d;
}

py::dict ReadStepLogSummary(py::handle path_arg) {
  const std::string path = PathArg("path", path_arg);
  absl::StatusOr<omni::StepLog> log;
  {
    py::gil_scoped_release release;
    log = omni::ReadStepLog(path);
  }
  return StepLogSummary(path, ValueOrThrow(std::move(log)));
}

py::object Evaluate(py::handle path_arg, int stride, double k, double horizon_s,
                    double min_window_s, int window, py::handle previous_arg) {
  const std::string path = PathArg("path", path_arg);
  const std::string previous_path =
      previous_arg.is_none() ? std::string() : PathArg("previous", previous_arg);
  if (stride < 1) throw py::value_error(absl::StrCat("stride must be >= 1, got ", stride));
  omni::EvaluateOptions options;
  options.stride_steps = stride;
  options.forecast.k = k;
  options.forecast.horizon_ns = SecondsToNanos("horizon_s", horizon_s);
  options.forecast.min_window_ns = SecondsToNanos("min_window_s", min_window_s);
  options.forecast.history_steps = window;
  absl::StatusOr<std::string> json;
  {
    py::gil_scoped_release release;
    absl::StatusOr<omni::StepLog> log = omni::ReadStepLog(path);
    absl::StatusOr<omni::StepLog> previous;
    if (log.ok() && !previous_path.empty()) {
      previous = omni::ReadStepLogTail(previous_path, options.previous_steps);
      if (previous.ok()) options.previous = &*previous;
    }
    if (!log.ok()) {
      json = log.status();
    } else if (!previous_path.empty() && !previous.ok()) {
      json = previous.status();
    } else {
      absl::StatusOr<omni::EvaluationReport> report = omni::Evaluate(*log, options);
      json = report.ok() ? absl::StatusOr<std::string>(report->ToJson())
                         : absl::StatusOr<std::string>(report.status());
    }
  }
  return JsonLoads(ValueOrThrow(std::move(json)));
}

// ---------------------------------------------------------------- misc

double PipelineBubbleFraction(int stages, int micro_batches) {
  if (stages < 1) throw py::value_error(absl::StrCat("stages must be >= 1, got ", stages));
  if (micro_batches < 1) {
    throw py::value_error(absl::StrCat("micro_batches must be >= 1, got ", micro_batches));
  }
  return omni::PipelineBubbleFraction(stages, micro_batches);
}

py::dict ProbeNccl() {
  absl::StatusOr<omni::NcclRuntimeInfo> info;
  {
    py::gil_scoped_release release;  // CUDA initialisation can take seconds
    info = omni::ProbeNccl();
  }
  const omni::NcclRuntimeInfo i = ValueOrThrow(std::move(info));
  py::dict d;
  d["compiled_version"] = i.compiled_version;
  d["runtime_version"] = i.runtime_version;
  d["cuda_devices"] = i.cuda_devices;
  d["supports_shrink"] = i.supports_shrink;
  return d;
}

}  // namespace

py::object TelemetryView(py::object owner, omni::Telemetry* telemetry,
                         std::shared_ptr<const bool> alive) {
  return py::cast(std::make_unique<PyTelemetry>(std::move(owner), telemetry, std::move(alive)));
}

void DefineTelemetry(py::module_& m) {
  py::class_<PyTelemetry>(m, "Telemetry",
                          "Step telemetry over omni::Telemetry; see omni.Telemetry.")
      .def(py::init([](const py::kwargs& kwargs) { return PyTelemetry::Create(kwargs); }))
      .def("register_phase", &PyTelemetry::RegisterPhase, py::arg("name"), py::arg("idle") = "busy")
      .def("find_phase", &PyTelemetry::FindPhase, py::arg("name"))
      .def("phases", &PyTelemetry::Phases)
      .def("add_callback_sink", &PyTelemetry::AddCallbackSink, py::arg("fn"),

           py::arg("name") = "callback")
      .def("add_store_sink", &PyTelemetry::AddStoreSink, py::arg("store"),
           py::arg("prefix") = "omni/telemetry", py::keep_alive<1, 2>(),
           "Publishes forecasts, window notices and the outlook under `prefix` in `store` (an "
           "omni.Store) for guests on other hosts (omni.StoreWindowSource).")
      .def("begin_step", &PyTelemetry::BeginStep, py::arg("step") = py::none())
      .def("end_step", &PyTelemetry::EndStep)
      .def("begin_phase", &PyTelemetry::BeginPhase, py::arg("phase"))
      .def("end_phase", &PyTelemetry::EndPhase, py::arg("phase"))
      .def("end_phase_as", &PyTelemetry::EndPhaseAs, py::arg("phase"), py::arg("recorded_as"),
           "Ends the innermost open phase, recorded as another phase (e.g. a save that was "
           "abandoned: host-side time, not a save).")
      .def("record_phase", &PyTelemetry::RecordPhase, py::arg("phase"), py::arg("seconds"))
      .def("flush", &PyTelemetry::Flush, py::arg("timeout_s") = 30.0)
      .def("snapshot", [](const PyTelemetry& t) { return JsonLoads(t.Snapshot().ToJson()); })
      .def("snapshot_table", [](const PyTelemetry& t) { return t.Snapshot().ToTable(); })
      .def("latest_forecast", &PyTelemetry::LatestForecast)
      .def("announce_busy", &PyTelemetry::AnnounceBusy, py::arg("until_ns"),
           "No idle window before until_ns (the telemetry's clock) for guests reading the window "
           "channel; 0 withdraws it.")
      .def("latest_outlook", &PyTelemetry::LatestOutlook,
           "The outlook the window channel carries: per idle kind the next forecast window, and "
           "the announced busy period.")
      .def("counters", &PyTelemetry::Counters)
      .def("options", &PyTelemetry::Options)
      .def("close", &PyTelemetry::Close)
      .def_property_readonly("closed", &PyTelemetry::closed);

  m.def("default_telemetry_options", &DefaultTelemetryOptions,
        "The keyword options of Telemetry(...) and their defaults, in Python units.");
  m.def("pipeline_bubble_fraction", &PipelineBubbleFraction, py::arg("stages"),
        py::arg("micro_batches"), "(p - 1) / (m + p - 1) for a GPipe schedule.");
  m.def("read_step_log", &ReadStepLogSummary, py::arg("path"),
        "Reads a JSON Lines step log and summarises it.");
  const omni::EvaluateOptions eval_defaults;
  m.def("evaluate", &Evaluate, py::arg("path"), py::arg("stride") = eval_defaults.stride_steps,
        py::arg("k") = eval_defaults.forecast.k,
        py::arg("horizon_s") = NanosToSeconds(eval_defaults.forecast.horizon_ns),
        py::arg("min_window_s") = NanosToSeconds(eval_defaults.forecast.min_window_ns),
        py::arg("window") = eval_defaults.forecast.history_steps, py::arg("previous") = py::none(),
        "Replays a step log against the forecasts it would have produced and scores them; "
        "previous: the log of the run before a resumed one, learned first (omni eval "
        "--previous).");
  m.def("probe_nccl", &ProbeNccl, "What the NCCL path can use on this host; raises otherwise.");
  m.def("nccl_library_version", &omni::NcclLibraryVersion,
        "The NCCL library version, without touching a device (0 when built without NCCL).");
}

}  // namespace omni_python
