// omni._C: the private native module behind the `omni` Python package. It binds
// omni::core (telemetry, forecasts, step logs, the evaluator, the NCCL probe,
// checkpoints with Python state objects, the preemption monitor, the sampler);
// python/omni/__init__.py is the documented facade and python/omni/_C.pyi
// types this module.
//
// Conventions:
//  - A bad absl::Status becomes a Python exception carrying the same message,
//    in one place (RaiseStatus): InvalidArgument -> ValueError, NotFound ->
//    FileNotFoundError, anything else -> RuntimeError.
//  - Durations are float seconds in Python and int64 nanoseconds in C++.
//  - Every call that may block or take a lock the telemetry worker also takes
//    runs with the GIL released: the worker takes the GIL to call Python
//    callback sinks, so waiting on it with the GIL held could deadlock. The
//    per-step hooks never block or lock (telemetry.h) and keep the GIL.
//  - No exception, C++ or Python, leaves code that runs on a C++ thread.
//  - Checkpoints: Python state objects (save(writer) / load(reader)) are
//    wrapped in a C++ omni::Stateful (PyStatefulAdapter) that the core calls
//    with the GIL released, on the thread that called save / restore; the
//    adapter takes the GIL, and turns whatever the object raises into a
//    Status (the exception itself is re-raised to the caller once the core
//    returns). Writer and reader handles are valid only during that call.
//
// Thread safety: all state here is touched with the GIL held, except the core
// objects, which are thread-safe where telemetry.h says so.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "omni/checkpoint.h"
#include "omni/clock.h"
#include "omni/evaluator.h"
#include "omni/forecast.h"
#include "omni/nccl.h"
#include "omni/phase.h"
#include "omni/preemption.h"
#include "omni/sampler.h"
#include "omni/sinks.h"
#include "omni/state.h"
#include "omni/stats.h"
#include "omni/step_log.h"
#include "omni/telemetry.h"
#include "omni/version.h"

namespace py = pybind11;

namespace omni_python {
namespace {

// ---------------------------------------------------------------- errors

// The one translation of a bad Status into a Python exception.
[[noreturn]] void RaiseStatus(const absl::Status& status) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      throw py::value_error(message);
    case absl::StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, message.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(message);  // RuntimeError
  }
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) RaiseStatus(result.status());
  return *std::move(result);
}

std::string TypeName(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// ---------------------------------------------------------------- conversions

constexpr double kNanosPerSecond = 1e9;

// Seconds (a Python option or argument named `name`) to nanoseconds.
// ValueError naming it unless finite, non-negative and representable.
int64_t SecondsToNanos(const char* name, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds * kNanosPerSecond > 9.0e18) {
    throw py::value_error(absl::StrCat(name,
                                       " must be a finite, non-negative number of seconds, got ",
                                       py::repr(py::float_(seconds)).cast<std::string>()));
  }
  return std::llround(seconds * kNanosPerSecond);
}

double NanosToSeconds(int64_t ns) { return static_cast<double>(ns) / kNanosPerSecond; }

// str or os.PathLike to a path string; TypeError naming `name` otherwise.
std::string PathArg(const char* name, py::handle value) {
  py::object path;
  try {
    path = py::module_::import("os").attr("fspath")(value);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error(
        absl::StrCat(name, " must be a str or os.PathLike path, got ", TypeName(value)));
  }
  return path.cast<std::string>();
}

py::object JsonLoads(const std::string& json) {
  return py::module_::import("json").attr("loads")(py::str(json));
}

// ---------------------------------------------------------------- options

// The keyword options of Telemetry(...), in Python units, listed once and
// visited both to read kwargs and to report the defaults.
template <typename Visitor>
void VisitTelemetryOptions(omni::TelemetryOptions& o, Visitor& v) {
  v.Int("window", &o.stats.window);
  v.Int("warmup_min_steps", &o.stats.warmup.min_steps);
  v.Int("warmup_max_steps", &o.stats.warmup.max_steps);
  v.Int("warmup_window", &o.stats.warmup.window);
  v.Float("warmup_max_drift", &o.stats.warmup.max_drift);
  v.Bool("forecast", &o.forecast_enabled);
  v.Seconds("horizon_s", &o.forecast.horizon_ns);
  v.Float("k", &o.forecast.k);
  v.Seconds("min_window_s", &o.forecast.min_window_ns);
  v.Int("max_windows", &o.forecast.max_windows);
  v.Int("checkpoint_every", &o.forecast.checkpoint.every_steps);
  v.Int("checkpoint_offset", &o.forecast.checkpoint.offset);
  v.Seconds("checkpoint_expected_s", &o.forecast.checkpoint.expected_ns);
  v.Int("eval_every", &o.forecast.eval.every_steps);
  v.Int("eval_offset", &o.forecast.eval.offset);
  v.Seconds("eval_expected_s", &o.forecast.eval.expected_ns);
  v.Int("pipeline_stages", &o.forecast.pipeline.stages);
  v.Int("pipeline_micro_batches", &o.forecast.pipeline.micro_batches);
  v.Int("pipeline_stage", &o.forecast.pipeline.stage);
  v.Float("pipeline_backward_over_forward", &o.forecast.pipeline.backward_over_forward);
  v.Seconds("publish_interval_s", &o.publish_interval_ns);
  v.Path("step_log", &o.step_log_path);
  v.Path("trace", &o.trace_path);
  v.Str("source", &o.source);
  v.Int("ring_capacity", &o.ring_capacity);
}
// Options handled outside TelemetryOptions.
constexpr const char* kForecastFileOption = "forecast_file";
constexpr const char* kClockOption = "clock";

// Reads options out of **kwargs; TypeError for an unknown name or a value of
// the wrong type, ValueError (naming the option) for a bad duration.
class KwargsReader {
 public:
  explicit KwargsReader(const py::kwargs& kwargs) : kwargs_(kwargs) {}

  template <typename T>
  void Int(const char* name, T* out) {
    if (py::handle v = Take(name)) {
      if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) Wrong(name, "an int", v);
      try {
        *out = v.cast<T>();
      } catch (const py::cast_error&) {
        throw py::value_error(
            absl::StrCat(name, " is out of range: ", py::repr(v).cast<std::string>()));
      }
    }
  }
  void Float(const char* name, double* out) {
    if (py::handle v = Take(name)) {
      if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) {
        Wrong(name, "a float", v);
      }
      *out = v.cast<double>();
    }
  }
  void Bool(const char* name, bool* out) {
    if (py::handle v = Take(name)) {
      if (!PyBool_Check(v.ptr())) Wrong(name, "a bool", v);
      *out = v.cast<bool>();
    }
  }
  void Seconds(const char* name, int64_t* out_ns) {
    if (!Given(name)) return;
    double seconds = 0;
    Float(name, &seconds);
    *out_ns = SecondsToNanos(name, seconds);
  }
  void Path(const char* name, std::string* out) {
    if (py::handle v = Take(name)) *out = v.is_none() ? std::string() : PathArg(name, v);
  }
  void Str(const char* name, std::string* out) {
    if (py::handle v = Take(name)) {
      if (!PyUnicode_Check(v.ptr())) Wrong(name, "a str", v);
      *out = v.cast<std::string>();
    }
  }
  // The value of `name` (marking it used), or a null handle when not given.
  py::handle Take(const char* name) {
    if (!Given(name)) return py::handle();
    used_.insert(name);
    return PyDict_GetItemString(kwargs_.ptr(), name);  // borrowed; kwargs_ holds it
  }
  bool Given(const char* name) const {
    return PyDict_GetItemString(kwargs_.ptr(), name) != nullptr;
  }
  // TypeError for the first keyword no visitor asked for.
  void CheckAllUsed(const char* callee) const {
    for (const auto& item : kwargs_) {
      const std::string key = py::str(item.first);
      if (used_.count(key) == 0) {
        throw py::type_error(
            absl::StrCat(callee, "() got an unexpected keyword argument '", key, "'"));
      }
    }
  }

 private:
  [[noreturn]] static void Wrong(const char* name, const char* want, py::handle v) {
    throw py::type_error(absl::StrCat(name, " must be ", want, ", got ", TypeName(v)));
  }
  const py::kwargs& kwargs_;
  std::set<std::string> used_;
};

// Writes options into a dict, in Python units.
class DictWriter {
 public:
  template <typename T>
  void Int(const char* name, T* v) {
    dict_[name] = *v;
  }
  void Float(const char* name, double* v) { dict_[name] = *v; }
  void Bool(const char* name, bool* v) { dict_[name] = *v; }
  void Seconds(const char* name, int64_t* ns) { dict_[name] = NanosToSeconds(*ns); }
  void Path(const char* name, std::string* v) {
    dict_[name] = v->empty() ? py::object(py::none()) : py::object(py::str(*v));
  }
  void Str(const char* name, std::string* v) { dict_[name] = *v; }
  py::dict& dict() { return dict_; }

 private:
  py::dict dict_;
};

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
  d["misuse_errors"] = c.misuse_errors;
  d["spans_truncated"] = c.spans_truncated;
  d["steps_rejected"] = c.steps_rejected;
  d["forecasts_published"] = c.forecasts_published;
  d["export_errors"] = c.export_errors;
  d["last_error"] = c.last_error.ok() ? std::string() : c.last_error.ToString();
  return d;
}

// ---------------------------------------------------------------- callbacks

// A Python object owned from C++ code that may run without the GIL (a sink
// inside the core telemetry): the reference is dropped with the GIL held.
class GilOwned {
 public:
  explicit GilOwned(py::object obj) : obj_(std::move(obj)) {}
  ~GilOwned() {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  GilOwned(const GilOwned&) = delete;
  GilOwned& operator=(const GilOwned&) = delete;
  const py::object& get() const { return obj_; }

 private:
  py::object obj_;
};

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

class PyTelemetry;

// Telemetries alive in this process (GIL-guarded), closed at interpreter exit
// so that no worker thread waits for the GIL of a finalizing interpreter.
std::unordered_set<PyTelemetry*>& LiveTelemetries() {
  static std::unordered_set<PyTelemetry*> live;
  return live;
}

class PyTelemetry {
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

    const omni::Clock* clock = omni::Clock::Real();
    if (!clock_obj.is_none()) {
      if (!py::isinstance<omni::FakeClock>(clock_obj)) {
        throw py::type_error(
            absl::StrCat("clock must be None or omni.FakeClock, got ", TypeName(clock_obj)));
      }
      clock = clock_obj.cast<omni::FakeClock*>();
    }

    // The file sink first: a bad forecast_file then leaves no step log or
    // trace file behind.
    absl::StatusOr<std::unique_ptr<omni::ForecastSink>> file_sink(nullptr);
    absl::StatusOr<std::unique_ptr<omni::Telemetry>> telemetry;
    {
      py::gil_scoped_release release;  // creates and opens files
      if (!forecast_file.empty()) file_sink = omni::MakeFileSink(forecast_file);
      if (file_sink.ok()) {
        telemetry = omni::Telemetry::Create(options, clock);
        if (telemetry.ok() && *file_sink != nullptr) (*telemetry)->AddSink(*std::move(file_sink));
      }
    }
    ThrowIfError(file_sink.status());
    ThrowIfError(telemetry.status());
    return std::make_unique<PyTelemetry>(std::move(clock_obj), *std::move(telemetry));
  }

  // Use Create().
  PyTelemetry(py::object clock, std::unique_ptr<omni::Telemetry> telemetry)
      : clock_(std::move(clock)), telemetry_(std::move(telemetry)) {
    LiveTelemetries().insert(this);
  }

  ~PyTelemetry() {
    LiveTelemetries().erase(this);
    CloseQuietly();  // joins the worker, so nothing below waits for it
    telemetry_.reset();
  }
  PyTelemetry(const PyTelemetry&) = delete;
  PyTelemetry& operator=(const PyTelemetry&) = delete;

  omni::PhaseId RegisterPhase(const std::string& name, const std::string& idle) {
    const omni::IdleKind kind = ValueOrThrow(omni::ParseIdleKind(idle));
    absl::StatusOr<omni::PhaseId> id;
    {
      py::gil_scoped_release release;
      id = telemetry_->RegisterPhase(name, kind);
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
      id = telemetry_->FindPhase(name);
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
      catalog = telemetry_->Phases();
    }
    return PhaseList(catalog);
  }

  void AddCallbackSink(py::object fn, std::string name) {
    if (!PyCallable_Check(fn.ptr())) {
      throw py::type_error(absl::StrCat("callback sink must be callable, got ", TypeName(fn)));
    }
    auto sink = MakePythonCallbackSink(std::move(fn), std::move(name));
    py::gil_scoped_release release;
    telemetry_->AddSink(std::move(sink));
  }

  // ---- per-step hooks.
  void BeginStep(std::optional<int64_t> step) {
    ThrowIfError(
        CallHook([&] { return step ? telemetry_->BeginStep(*step) : telemetry_->BeginStep(); }));
  }
  void EndStep() {
    ThrowIfError(CallHook([&] { return telemetry_->EndStep(); }));
  }
  void BeginPhase(py::handle phase) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return telemetry_->BeginPhase(id); }));
  }
  void EndPhase(py::handle phase) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return telemetry_->EndPhase(id); }));
  }
  void RecordPhase(py::handle phase, double seconds) {
    const omni::PhaseId id = ResolvePhase(phase);
    ThrowIfError(CallHook([&] { return telemetry_->RecordPhase(id, seconds); }));
  }

  // ---- any thread
  void Flush(double timeout_s) {
    const int64_t timeout_ns = SecondsToNanos("timeout_s", timeout_s);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = telemetry_->Flush(absl::Nanoseconds(timeout_ns));
    }
    ThrowIfError(status);
  }

  omni::StatsSnapshot Snapshot() const {
    py::gil_scoped_release release;
    return telemetry_->Snapshot();
  }

  py::object LatestForecast() const {
    absl::StatusOr<omni::Forecast> forecast;
    {
      py::gil_scoped_release release;
      forecast = telemetry_->LatestForecast();
    }
    if (absl::IsFailedPrecondition(forecast.status())) return py::none();
    return ForecastDict(ValueOrThrow(std::move(forecast)));
  }

  py::dict Counters() const {
    omni::TelemetryCounters counters;
    {
      py::gil_scoped_release release;
      counters = telemetry_->Counters();
    }
    return CountersDict(counters);
  }

  // The forecast options in effect (the forecaster is immutable).
  py::dict Options() const {
    const omni::ForecastOptions& forecast = telemetry_->forecaster().options();
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
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = telemetry_->Close();
    }
    closed_ = true;
    ThrowIfError(status);
  }

  // Close() without raising; for interpreter exit and destruction.
  void CloseQuietly() {
    if (closed_) return;
    closed_ = true;
    py::gil_scoped_release release;
    telemetry_->Close().IgnoreError();
  }

  bool closed() const { return closed_; }

 private:
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
        id = telemetry_->FindPhase(name);
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
  py::object clock_;
  std::unique_ptr<omni::Telemetry> telemetry_;
  std::unordered_map<std::string, omni::PhaseId> phase_ids_;  // resolved names
  bool closed_ = false;
};

void CloseAllTelemetries() {
  const std::vector<PyTelemetry*> live(LiveTelemetries().begin(), LiveTelemetries().end());
  for (PyTelemetry* t : live) t->CloseQuietly();
}

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
                    double min_window_s, int window) {
  const std::string path = PathArg("path", path_arg);
  if (stride < 1) throw py::value_error(absl::StrCat("stride must be >= 1, got ", stride));
  omni::EvaluateOptions options;
  options.stride_steps = stride;
  options.forecast.k = k;
  options.forecast.horizon_ns = SecondsToNanos("horizon_s", horizon_s);
  options.forecast.min_window_ns = SecondsToNanos("min_window_s", min_window_s);
  options.stats.window = window;
  absl::StatusOr<std::string> json;
  {
    py::gil_scoped_release release;
    absl::StatusOr<omni::StepLog> log = omni::ReadStepLog(path);
    if (!log.ok()) {
      json = log.status();
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

void AdvanceClock(omni::FakeClock& clock, double seconds) {
  clock.Advance(std::chrono::nanoseconds(SecondsToNanos("seconds", seconds)));
}

// ---------------------------------------------------------------- state: buffers

// numpy's name of a DType ("bfloat16" has no numpy dtype).
const char* NumpyDTypeName(omni::DType dtype) {
  switch (dtype) {
    case omni::DType::kBool:
      return "bool";
    case omni::DType::kU8:
      return "uint8";
    case omni::DType::kI8:
      return "int8";
    case omni::DType::kI16:
      return "int16";
    case omni::DType::kI32:
      return "int32";
    case omni::DType::kI64:
      return "int64";
    case omni::DType::kF16:
      return "float16";
    case omni::DType::kBF16:
      return "bfloat16";
    case omni::DType::kF32:
      return "float32";
    case omni::DType::kF64:
      return "float64";
  }
  return "unknown";
}

// A Py_buffer, released when it goes out of scope (with the GIL held: it is
// only used on threads that hold it).
class BufferView {
 public:
  BufferView() = default;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  // False (and no Python error set) when `obj` cannot export such a buffer.
  bool Acquire(py::handle obj, int flags) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  const Py_buffer& view() const { return view_; }
  std::vector<int64_t> shape() const {
    std::vector<int64_t> shape;
    for (int i = 0; i < view_.ndim; ++i) shape.push_back(view_.shape[i]);
    return shape;
  }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// The DType of a buffer item (struct-module format and item size), or
// nullopt. Native and little-endian formats are the same on the hosts Omni
// supports (little-endian); big-endian items are refused.
std::optional<omni::DType> BufferDType(const char* format, Py_ssize_t itemsize) {
  std::string f = format == nullptr ? "B" : format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) {
    f.erase(0, 1);
  } else if (!f.empty() && (f[0] == '>' || f[0] == '!')) {
    if (itemsize != 1) return std::nullopt;
    f.erase(0, 1);
  }
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case '?':
      if (itemsize == 1) return omni::DType::kBool;
      break;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      if (itemsize == 1) return omni::DType::kI8;
      if (itemsize == 2) return omni::DType::kI16;
      if (itemsize == 4) return omni::DType::kI32;
      if (itemsize == 8) return omni::DType::kI64;
      break;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
    case 'c':
      if (itemsize == 1) return omni::DType::kU8;
      break;
    case 'e':
      if (itemsize == 2) return omni::DType::kF16;
      break;
    case 'f':
      if (itemsize == 4) return omni::DType::kF32;
      break;
    case 'd':
      if (itemsize == 8) return omni::DType::kF64;
      break;
    default:
      break;
  }
  return std::nullopt;
}

omni::DType BufferDTypeOrThrow(const char* method, const std::string& key, const BufferView& buf) {
  const Py_buffer& v = buf.view();
  std::optional<omni::DType> dtype = BufferDType(v.format, v.itemsize);
  if (!dtype) {
    throw py::value_error(absl::StrCat(
        method, "('", key, "'): unsupported element type (buffer format '",
        v.format == nullptr ? "B" : v.format, "', ", v.itemsize,
        " bytes); supported: bool, uint8, int8, int16, int32, int64, float16, float32, float64"));
  }
  return *dtype;
}

// ---------------------------------------------------------------- state: writer / reader

// omni.StateWriter: the writer handed to a Python object's save(writer). It
// is valid only during that call. `last_error` keeps the core's error behind
// the exception a method raised, so that the Status reaching the core is the
// core's own (e.g. the asynchronous snapshot's size limit).
class PyStateWriter {
 public:
  explicit PyStateWriter(omni::StateWriter* writer) : writer_(writer) {}

  void PutTensor(const std::string& key, py::handle array) {
    omni::StateWriter& w = writer();
    if (!PyObject_CheckBuffer(array.ptr())) {
      throw py::type_error(absl::StrCat("put_tensor('", key,
                                        "'): expected a numpy array or an object supporting the "
                                        "buffer protocol, got ",
                                        TypeName(array)));
    }
    py::object holder = py::reinterpret_borrow<py::object>(array);
    BufferView buf;
    if (!buf.Acquire(holder, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
      // Not C-contiguous: save a contiguous copy.
      holder = py::module_::import("numpy").attr("ascontiguousarray")(holder);
      if (!buf.Acquire(holder, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
        throw py::value_error(
            absl::StrCat("put_tensor('", key, "'): cannot get a C-contiguous buffer"));
      }
    }
    const omni::DType dtype = BufferDTypeOrThrow("put_tensor", key, buf);
    std::vector<int64_t> shape = buf.shape();
    absl::Status status;
    {
      py::gil_scoped_release release;  // streams to the file
      status = w.PutTensor(key, dtype, std::move(shape), buf.view().buf,
                           static_cast<size_t>(buf.view().len));
    }
    Check(status);
  }

  void PutBytes(const std::string& key, py::handle data) {
    omni::StateWriter& w = writer();
    BufferView buf;
    if (PyUnicode_Check(data.ptr()) || !PyObject_CheckBuffer(data.ptr()) ||
        !buf.Acquire(data, PyBUF_C_CONTIGUOUS)) {
      throw py::type_error(absl::StrCat("put_bytes('", key,
                                        "'): expected bytes, bytearray or a contiguous buffer, "
                                        "got ",
                                        TypeName(data)));
    }
    const std::string_view bytes(static_cast<const char*>(buf.view().buf),
                                 static_cast<size_t>(buf.view().len));
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = w.PutBytes(key, bytes);
    }
    Check(status);
  }

  void Invalidate() { writer_ = nullptr; }
  const absl::Status& last_error() const { return last_error_; }
  omni::StateWriter& writer() const {
    if (writer_ == nullptr) {
      throw std::runtime_error("this StateWriter is no longer valid (use it only inside save())");
    }
    return *writer_;
  }

 private:
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    last_error_ = status;
    RaiseStatus(status);
  }
  omni::StateWriter* writer_;
  absl::Status last_error_;
};

// omni.StateReader: the reader handed to a Python object's load(reader),
// valid only during that call. A missing key raises KeyError.
class PyStateReader {
 public:
  explicit PyStateReader(const omni::StateReader* reader) : reader_(reader) {}

  py::tuple Find(const std::string& key) {
    const omni::StateReader::Info info = ValueOrThrow(Check(reader().Find(key)));
    py::tuple shape(info.shape.size());
    for (size_t i = 0; i < info.shape.size(); ++i) shape[i] = info.shape[i];
    return py::make_tuple(NumpyDTypeName(info.dtype), shape);
  }

  bool Contains(const std::string& key) const { return reader().Find(key).ok(); }

  void ReadTensorInto(const std::string& key, py::handle out) {
    const omni::StateReader& r = reader();
    if (!PyObject_CheckBuffer(out.ptr())) {
      throw py::type_error(absl::StrCat("read_tensor_into('", key,
                                        "'): out must be a numpy array or a writable buffer, got ",
                                        TypeName(out)));
    }
    BufferView buf;
    if (!buf.Acquire(out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
      throw py::value_error(absl::StrCat("read_tensor_into('", key,
                                         "'): out must be a writable, C-contiguous array"));
    }
    const omni::DType dtype = BufferDTypeOrThrow("read_tensor_into", key, buf);
    const std::vector<int64_t> shape = buf.shape();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = r.ReadTensor(key, dtype, shape, buf.view().buf, static_cast<size_t>(buf.view().len));
    }
    Check(status);
  }

  py::object ReadTensor(const std::string& key) {
    const omni::StateReader::Info info = ValueOrThrow(Check(reader().Find(key)));
    if (info.dtype == omni::DType::kBF16) {
      throw py::value_error(absl::StrCat("read_tensor('", key,
                                         "'): bfloat16 has no numpy dtype (use a torch state)"));
    }
    py::tuple shape(info.shape.size());
    for (size_t i = 0; i < info.shape.size(); ++i) shape[i] = info.shape[i];
    py::object array =
        py::module_::import("numpy").attr("empty")(shape, NumpyDTypeName(info.dtype));
    ReadTensorInto(key, array);
    return array;
  }

  py::bytes ReadBytes(const std::string& key) {
    absl::StatusOr<std::string> bytes;
    {
      const omni::StateReader& r = reader();
      py::gil_scoped_release release;
      bytes = r.ReadBytes(key);
    }
    return py::bytes(ValueOrThrow(Check(std::move(bytes))));
  }

  std::vector<std::string> Keys(const std::string& prefix) const { return reader().Keys(prefix); }

  void Invalidate() { reader_ = nullptr; }
  const absl::Status& last_error() const { return last_error_; }
  const omni::StateReader& reader() const {
    if (reader_ == nullptr) {
      throw std::runtime_error("this StateReader is no longer valid (use it only inside load())");
    }
    return *reader_;
  }

 private:
  // Records an error; a missing key raises KeyError rather than FileNotFoundError.
  void Record(const absl::Status& status) {
    if (status.ok()) return;
    last_error_ = status;
    if (absl::IsNotFound(status)) {
      PyErr_SetString(PyExc_KeyError, std::string(status.message()).c_str());
      throw py::error_already_set();
    }
  }
  template <typename T>
  absl::StatusOr<T> Check(absl::StatusOr<T> result) {
    Record(result.status());
    return result;
  }
  void Check(const absl::Status& status) {
    Record(status);
    if (!status.ok()) RaiseStatus(status);
  }

  const omni::StateReader* reader_;
  absl::Status last_error_;
};

// ---------------------------------------------------------------- state: registry

// The last Python exception a Python state object raised during one
// checkpoint call; re-raised to the caller when the core call fails.
struct PyErrorSlot {
  std::optional<py::error_already_set> error;
};

absl::Status StatusOfPythonError(const py::error_already_set& e, const std::string& where) {
  const std::string message = absl::StrCat(where, " raised ", e.what());
  if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError)) {
    return absl::InvalidArgumentError(message);
  }
  if (e.matches(PyExc_KeyError) || e.matches(PyExc_FileNotFoundError)) {
    return absl::NotFoundError(message);
  }
  return absl::UnknownError(message);
}

// An omni::Stateful over a Python object with save(writer) / load(reader).
// The core calls it with the GIL released (from the thread that called save
// or restore); it takes the GIL and never lets an exception out.
class PyStatefulAdapter final : public omni::Stateful {
 public:
  PyStatefulAdapter(std::string name, py::object object, PyErrorSlot* slot)
      : name_(std::move(name)), object_(std::move(object)), slot_(slot) {}
  ~PyStatefulAdapter() override {
    py::gil_scoped_acquire gil;
    object_ = py::object();
  }
  PyStatefulAdapter(const PyStatefulAdapter&) = delete;
  PyStatefulAdapter& operator=(const PyStatefulAdapter&) = delete;

  absl::Status Save(omni::StateWriter& writer) const override {
    return Call<PyStateWriter>("save", &writer);
  }
  absl::Status Load(const omni::StateReader& reader) override {
    return Call<PyStateReader>("load", &reader);
  }

 private:
  template <typename Handle, typename Core>
  absl::Status Call(const char* method, Core* core) const {
    py::gil_scoped_acquire gil;
    const std::string where = absl::StrCat("'", name_, "'.", method, "()");
    try {
      py::object handle = py::cast(Handle(core));
      auto& h = handle.cast<Handle&>();
      struct Invalidator {
        Handle& h;
        ~Invalidator() { h.Invalidate(); }
      } invalidator{h};
      try {
        object_.attr(method)(handle);
        return absl::OkStatus();
      } catch (py::error_already_set& e) {
        if (!h.last_error().ok()) return h.last_error();  // the core's own error
        absl::Status status = StatusOfPythonError(e, where);
        slot_->error.reset();
        slot_->error.emplace(std::move(e));
        return status;
      }
    } catch (py::error_already_set& e) {
      return StatusOfPythonError(e, where);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(where, " failed: ", e.what()));
    } catch (...) {
      return absl::InternalError(absl::StrCat(where, " failed with an unknown C++ exception"));
    }
  }

  std::string name_;
  py::object object_;
  PyErrorSlot* slot_;
};

// omni.StateRegistry: named state objects, in registration order. An object
// is either a native omni state (DistributedSampler) or any Python object
// with save(writer) and load(reader) methods. Keeps every object alive.
class PyStateRegistry {
 public:
  PyStateRegistry() = default;
  PyStateRegistry(const PyStateRegistry&) = delete;
  PyStateRegistry& operator=(const PyStateRegistry&) = delete;

  py::object Register(const std::string& name, py::object object) {
    omni::Stateful* stateful = nullptr;
    std::unique_ptr<PyStatefulAdapter> adapter;
    if (py::isinstance<omni::DistributedSampler>(object)) {
      stateful = object.cast<omni::DistributedSampler*>();
    } else {
      for (const char* method : {"save", "load"}) {
        if (!py::hasattr(object, method) || !PyCallable_Check(object.attr(method).ptr())) {
          throw py::type_error(absl::StrCat("state object '", name,
                                            "' must have save(writer) and load(reader) methods, "
                                            "got ",
                                            TypeName(object)));
        }
      }
      adapter = std::make_unique<PyStatefulAdapter>(name, object, &slot_);
      stateful = adapter.get();
    }
    const absl::Status status = registry_.Register(name, stateful);
    if (absl::IsAlreadyExists(status)) RaiseStatus(absl::InvalidArgumentError(status.message()));
    ThrowIfError(status);
    objects_.emplace_back(name, object);
    adapters_.push_back(std::move(adapter));
    return object;
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, object] : objects_) names.push_back(name);
    return names;
  }
  py::object Get(const std::string& name) const {
    for (const auto& [n, object] : objects_) {
      if (n == name) return object;
    }
    PyErr_SetString(PyExc_KeyError, name.c_str());
    throw py::error_already_set();
  }
  bool Contains(const std::string& name) const {
    for (const auto& entry : objects_) {
      if (entry.first == name) return true;
    }
    return false;
  }
  size_t size() const { return objects_.size(); }

  const omni::StateRegistry& registry() const { return registry_; }
  // Before a checkpoint call: forget an earlier call's Python error.
  void ClearError() { slot_.error.reset(); }
  // After a failed checkpoint call: re-raises the Python exception a state
  // object raised (noting the core's message), else the core's error.
  [[noreturn]] void Raise(const absl::Status& status) {
    if (slot_.error) {
      py::error_already_set e = std::move(*slot_.error);
      slot_.error.reset();
      py::object value = e.value();
      if (value && py::hasattr(value, "add_note")) {
        value.attr("add_note")(absl::StrCat("omni: ", status.message()));
      }
      throw e;
    }
    RaiseStatus(status);
  }

 private:
  omni::StateRegistry registry_;
  PyErrorSlot slot_;
  std::vector<std::pair<std::string, py::object>> objects_;
  std::vector<std::unique_ptr<PyStatefulAdapter>> adapters_;  // null for native objects
};

// ---------------------------------------------------------------- checkpoints

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

class PyCheckpointManager;

// Managers alive in this process (GIL-guarded), closed at interpreter exit so
// that a pending asynchronous save is finished before the process ends.
std::unordered_set<PyCheckpointManager*>& LiveManagers() {
  static std::unordered_set<PyCheckpointManager*> live;
  return live;
}

using Metadata = std::map<std::string, std::string>;

class PyCheckpointManager {
 public:
  static std::unique_ptr<PyCheckpointManager> Open(py::handle dir, int rank, int world_size,
                                                   std::string job_id, int keep_last,
                                                   int64_t keep_every, int64_t max_snapshot_bytes,
                                                   bool wait_for_pending, double shard_timeout_s,
                                                   bool keep_snapshot_memory, bool start_fresh) {
    omni::CheckpointOptions options;
    options.dir = PathArg("dir", dir);
    options.rank = rank;
    options.world_size = world_size;
    options.job_id = std::move(job_id);
    options.keep_last = keep_last;
    options.keep_every = keep_every;
    if (max_snapshot_bytes < 0) {
      throw py::value_error(
          absl::StrCat("max_snapshot_bytes must be >= 0, got ", max_snapshot_bytes));
    }
    options.max_snapshot_bytes = static_cast<size_t>(max_snapshot_bytes);
    options.wait_for_pending = wait_for_pending;
    options.keep_snapshot_memory = keep_snapshot_memory;
    options.start_fresh = start_fresh;
    options.shard_timeout = absl::Nanoseconds(SecondsToNanos("shard_timeout_s", shard_timeout_s));
    absl::StatusOr<std::unique_ptr<omni::CheckpointManager>> manager;
    {
      py::gil_scoped_release release;
      manager = omni::CheckpointManager::Open(options);
    }
    return std::make_unique<PyCheckpointManager>(options.dir, ValueOrThrow(std::move(manager)));
  }

  // Use Open().
  PyCheckpointManager(std::string dir, std::unique_ptr<omni::CheckpointManager> manager)
      : dir_(std::move(dir)), manager_(std::move(manager)) {
    LiveManagers().insert(this);
  }
  ~PyCheckpointManager() {
    LiveManagers().erase(this);
    CloseQuietly();
  }
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
  void CloseQuietly() {
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

void CloseAllManagers() {
  const std::vector<PyCheckpointManager*> live(LiveManagers().begin(), LiveManagers().end());
  for (PyCheckpointManager* m : live) m->CloseQuietly();
}

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

// ---------------------------------------------------------------- preemption

class PyPreemptionMonitor;

std::unordered_set<PyPreemptionMonitor*>& LiveMonitors() {
  static std::unordered_set<PyPreemptionMonitor*> live;
  return live;
}

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

class PyPreemptionMonitor {
 public:
  static std::unique_ptr<PyPreemptionMonitor> Create(std::optional<std::vector<int>> signals,
                                                     py::handle notice_file, double grace_s,
                                                     double k, bool apply_environment,
                                                     double notice_poll_s, py::object clock_obj) {
    omni::PreemptionOptions options;
    if (signals) options.signals = *signals;
    if (!notice_file.is_none()) options.notice_file = PathArg("notice_file", notice_file);
    options.grace = absl::Nanoseconds(SecondsToNanos("grace_s", grace_s));
    options.k = k;
    options.notice_poll = absl::Nanoseconds(SecondsToNanos("notice_poll_s", notice_poll_s));
    if (apply_environment) ThrowIfError(omni::ApplyEnvironment(options));
    const omni::Clock* clock = omni::Clock::Real();
    if (!clock_obj.is_none()) {
      if (!py::isinstance<omni::FakeClock>(clock_obj)) {
        throw py::type_error(
            absl::StrCat("clock must be None or omni.FakeClock, got ", TypeName(clock_obj)));
      }
      clock = clock_obj.cast<omni::FakeClock*>();
    }
    absl::StatusOr<std::unique_ptr<omni::PreemptionMonitor>> monitor;
    {
      py::gil_scoped_release release;
      monitor = omni::PreemptionMonitor::Create(options, clock);
    }
    return std::make_unique<PyPreemptionMonitor>(
        std::move(clock_obj), clock, ValueOrThrow(std::move(monitor)),
        NanosToSeconds(absl::ToInt64Nanoseconds(options.grace)));
  }

  // Use Create().
  PyPreemptionMonitor(py::object clock_obj, const omni::Clock* clock,
                      std::unique_ptr<omni::PreemptionMonitor> monitor, double grace_s)
      : clock_obj_(std::move(clock_obj)),
        clock_(clock),
        monitor_(std::move(monitor)),
        grace_s_(grace_s) {
    LiveMonitors().insert(this);
  }
  ~PyPreemptionMonitor() {
    LiveMonitors().erase(this);
    Close();
  }
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

 private:
  omni::PreemptionMonitor& monitor() const {
    if (monitor_ == nullptr) throw std::runtime_error("the PreemptionMonitor is closed");
    return *monitor_;
  }
  py::object clock_obj_;  // keeps a FakeClock alive while the monitor reads it
  const omni::Clock* clock_;
  std::unique_ptr<omni::PreemptionMonitor> monitor_;
  double grace_s_;
};

void CloseAllMonitors() {
  const std::vector<PyPreemptionMonitor*> live(LiveMonitors().begin(), LiveMonitors().end());
  for (PyPreemptionMonitor* m : live) m->Close();
}

// ---------------------------------------------------------------- sampler

void CheckCursor(int64_t epoch, int64_t offset) {
  if (epoch < 0 || offset < 0) {
    throw py::value_error(
        absl::StrCat("cursor must not be negative, got (", epoch, ", ", offset, ")"));
  }
}

py::tuple CursorTuple(const omni::SamplerCursor& c) { return py::make_tuple(c.epoch, c.offset); }

void DefineCheckpoints(py::module_& m) {
  m.attr("EXIT_PREEMPTED") = omni::kExitPreempted;
  m.attr("EXIT_PREEMPTED_NO_SAVE") = omni::kExitPreemptedNoSave;

  py::class_<PyStateWriter>(m, "StateWriter",
                            "Receives one state object's tensors and blobs inside its save().")
      .def("put_tensor", &PyStateWriter::PutTensor, py::arg("key"), py::arg("array"),
           "Saves a numpy array (or any buffer) under `key`; a non-contiguous array is copied.")
      .def("put_bytes", &PyStateWriter::PutBytes, py::arg("key"), py::arg("data"),
           "Saves a byte string under `key`.");

  py::class_<PyStateReader>(m, "StateReader",
                            "Reads one state object's tensors and blobs back inside its load().")
      .def("find", &PyStateReader::Find, py::arg("key"),
           "(dtype name, shape) of the tensor `key`; KeyError when absent.")
      .def("__contains__", &PyStateReader::Contains, py::arg("key"))
      .def("read_tensor_into", &PyStateReader::ReadTensorInto, py::arg("key"), py::arg("out"),
           "Copies tensor `key` into `out` (a writable C-contiguous array of the same dtype and "
           "shape; ValueError naming the key otherwise).")
      .def("read_tensor", &PyStateReader::ReadTensor, py::arg("key"),
           "Tensor `key` as a new numpy array.")
      .def("read_bytes", &PyStateReader::ReadBytes, py::arg("key"),
           "The byte string saved under `key`.")
      .def("keys", &PyStateReader::Keys, py::arg("prefix") = "",
           "The object's keys that start with `prefix`, sorted.");

  py::class_<PyStateRegistry>(m, "StateRegistry", "Named state objects; see omni.StateRegistry.")
      .def(py::init<>())
      .def("register", &PyStateRegistry::Register, py::arg("name"), py::arg("obj"),
           "Registers `obj` under `name` (its key prefix) and returns it.")
      .def("names", &PyStateRegistry::Names)
      .def("__getitem__", &PyStateRegistry::Get, py::arg("name"))
      .def("__contains__", &PyStateRegistry::Contains, py::arg("name"))
      .def("__len__", &PyStateRegistry::size);

  const omni::CheckpointOptions defaults;
  py::class_<PyCheckpointManager>(m, "CheckpointManager",
                                  "Checkpoints of one rank; see omni.CheckpointManager.")
      .def(py::init(&PyCheckpointManager::Open), py::arg("dir"), py::arg("rank") = defaults.rank,
           py::arg("world_size") = defaults.world_size, py::arg("job_id") = defaults.job_id,
           py::arg("keep_last") = defaults.keep_last, py::arg("keep_every") = defaults.keep_every,
           py::arg("max_snapshot_bytes") = static_cast<int64_t>(defaults.max_snapshot_bytes),
           py::arg("wait_for_pending") = defaults.wait_for_pending,
           py::arg("shard_timeout_s") = absl::ToDoubleSeconds(defaults.shard_timeout),
           py::arg("keep_snapshot_memory") = defaults.keep_snapshot_memory,
           py::arg("start_fresh") = defaults.start_fresh)
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

  const omni::PreemptionOptions pdefaults;
  py::class_<PyPreemptionMonitor>(m, "PreemptionMonitor",
                                  "Signals and notices acted upon at step boundaries.")
      .def(py::init(&PyPreemptionMonitor::Create), py::arg("signals") = py::none(),
           py::arg("notice_file") = py::none(),
           py::arg("grace_s") = absl::ToDoubleSeconds(pdefaults.grace), py::arg("k") = pdefaults.k,
           py::arg("apply_environment") = true,
           py::arg("notice_poll_s") = absl::ToDoubleSeconds(pdefaults.notice_poll),
           py::arg("clock") = py::none())
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

  py::class_<omni::DistributedSampler>(m, "DistributedSampler",
                                       "A resumable, deterministic distributed sampler.")
      .def(py::init([](int64_t dataset_size, int64_t global_batch, uint64_t seed, bool shuffle,
                       bool drop_last) {
             omni::SamplerOptions options;
             options.dataset_size = dataset_size;
             options.global_batch = global_batch;
             options.seed = seed;
             options.shuffle = shuffle;
             options.drop_last = drop_last;
             return ValueOrThrow(omni::DistributedSampler::Create(options));
           }),
           py::arg("dataset_size"), py::arg("global_batch") = 1, py::arg("seed") = 0,
           py::arg("shuffle") = true, py::arg("drop_last") = true)
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

  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    CloseAllManagers();
    CloseAllMonitors();
  }));
}

}  // namespace

void DefineModule(py::module_& m) {
  m.doc() = "Private native module of the omni package (use `import omni`).";
  m.attr("__version__") = omni::Version();

  m.def(
      "version", [] { return std::string(omni::Version()); },
      "The version of the linked omni core library, 'MAJOR.MINOR.PATCH'.");
  m.def("build_info", &omni::BuildInfo,
        "One line describing the build: version, Gloo and NCCL availability.");

  py::tuple idle_kinds(omni::kNumIdleKinds);
  for (int i = 0; i < omni::kNumIdleKinds; ++i) {
    idle_kinds[i] = std::string(omni::IdleKindName(static_cast<omni::IdleKind>(i)));
  }
  m.attr("IDLE_KINDS") = idle_kinds;
  py::tuple step_kinds(omni::kNumStepKinds);
  for (int i = 0; i < omni::kNumStepKinds; ++i) {
    step_kinds[i] = std::string(omni::StepKindName(static_cast<omni::StepKind>(i)));
  }
  m.attr("STEP_KINDS") = step_kinds;

  m.attr("DATA_WAIT") = static_cast<int>(omni::phase::kDataWait);
  m.attr("COMPUTE") = static_cast<int>(omni::phase::kCompute);
  m.attr("COMM") = static_cast<int>(omni::phase::kComm);
  m.attr("OPTIMIZER") = static_cast<int>(omni::phase::kOptimizer);
  m.attr("CHECKPOINT") = static_cast<int>(omni::phase::kCheckpoint);
  m.attr("EVAL") = static_cast<int>(omni::phase::kEval);
  m.attr("PIPELINE_BUBBLE") = static_cast<int>(omni::phase::kPipelineBubble);
  m.attr("HOST") = static_cast<int>(omni::phase::kHost);
  m.attr("NUM_BUILTIN_PHASES") = omni::phase::kNumBuiltin;
  m.attr("MAX_PHASES") = omni::kMaxPhases;
  m.attr("MAX_PHASE_DEPTH") = omni::kMaxPhaseDepth;
  m.attr("MAX_SPANS_PER_STEP") = omni::kMaxSpansPerStep;

  py::class_<omni::FakeClock>(m, "FakeClock", "A clock that only moves when told to (for tests).")
      .def(py::init<int64_t>(), py::arg("start_ns") = 1'000'000'000)
      .def("now_ns", &omni::FakeClock::NowNanos, "Current time in nanoseconds.")
      .def("advance", &AdvanceClock, py::arg("seconds"),
           "Moves the clock forward by `seconds` (finite, >= 0).")
      .def(
          "advance_ns",
          [](omni::FakeClock& c, int64_t ns) {
            if (ns < 0) throw py::value_error(absl::StrCat("ns must be >= 0, got ", ns));
            c.Advance(std::chrono::nanoseconds(ns));
          },
          py::arg("ns"), "Moves the clock forward by `ns` nanoseconds.")
      .def("set_ns", &omni::FakeClock::Set, py::arg("ns"), "Sets the time in nanoseconds.");

  py::class_<PyTelemetry>(m, "Telemetry",
                          "Step telemetry over omni::Telemetry; see omni.Telemetry.")
      .def(py::init([](const py::kwargs& kwargs) { return PyTelemetry::Create(kwargs); }))
      .def("register_phase", &PyTelemetry::RegisterPhase, py::arg("name"), py::arg("idle") = "busy")
      .def("find_phase", &PyTelemetry::FindPhase, py::arg("name"))
      .def("phases", &PyTelemetry::Phases)
      .def("add_callback_sink", &PyTelemetry::AddCallbackSink, py::arg("fn"),
           py::arg("name") = "callback")
      .def("begin_step", &PyTelemetry::BeginStep, py::arg("step") = py::none())
      .def("end_step", &PyTelemetry::EndStep)
      .def("begin_phase", &PyTelemetry::BeginPhase, py::arg("phase"))
      .def("end_phase", &PyTelemetry::EndPhase, py::arg("phase"))
      .def("record_phase", &PyTelemetry::RecordPhase, py::arg("phase"), py::arg("seconds"))
      .def("flush", &PyTelemetry::Flush, py::arg("timeout_s") = 30.0)
      .def("snapshot", [](const PyTelemetry& t) { return JsonLoads(t.Snapshot().ToJson()); })
      .def("snapshot_table", [](const PyTelemetry& t) { return t.Snapshot().ToTable(); })
      .def("latest_forecast", &PyTelemetry::LatestForecast)
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
        py::arg("window") = eval_defaults.stats.window,
        "Replays a step log against the forecasts it would have produced and scores them.");
  m.def("probe_nccl", &ProbeNccl, "What the NCCL path can use on this host; raises otherwise.");
  m.def("nccl_library_version", &omni::NcclLibraryVersion,
        "The NCCL library version, without touching a device (0 when built without NCCL).");

  DefineCheckpoints(m);
  py::module_::import("atexit").attr("register")(py::cpp_function(&CloseAllTelemetries));
}

}  // namespace omni_python

PYBIND11_MODULE(_C, m) { omni_python::DefineModule(m); }
