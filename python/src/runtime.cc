// omni._C runtime: omni.Runtime, the one door, over omni::Runtime
// (include/omni/runtime.h) as it is, so that the step-boundary state machine
// (commit, periodic checkpoint, a new generation, recovery after a failed
// collective, preemption with costs from the telemetry, save and exit) lives
// in one place for C++ and Python.
//
// Options: RuntimeOptions::FromEnvironment() (torchrun, Slurm, OMNI_*) unless
// environment=False, then the keywords, which win. Whole option groups are
// nested dicts (telemetry=, preemption=, elastic=, sampler=, with the
// keywords of omni.Telemetry, omni.PreemptionMonitor, omni.ElasticGroup and
// omni.DistributedSampler); the common ones are also top-level keywords.
//
// State: Python objects with save(writer) / load(reader) (or a native
// DistributedSampler), registered replicated or per replica; the core calls
// them with the GIL released and they take it (PyStatefulAdapter). An
// exception one raises is re-raised to the caller of start() / end_step().
//
// Thread safety: one training thread calls everything, GIL held; every call
// that may block (start, end_step, allreduce, finish, close) releases it.

#include "omni/runtime.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "collectives.h"
#include "common.h"
#include "omni/sampler.h"
#include "options.h"
#include "state.h"
#include "store.h"

namespace omni_python {
namespace {

// A nested dict of options `name` (None or absent: nothing), read by `visit`.
template <typename Visit>
void Nested(KwargsReader& reader, const char* name, const Visit& visit) {
  const py::handle h = reader.Take(name);
  if (!h || h.is_none()) return;
  if (!PyDict_Check(h.ptr())) {
    throw py::type_error(
        absl::StrCat("Runtime: ", name, " must be a dict of options, got ", TypeName(h)));
  }
  const auto kwargs = py::reinterpret_borrow<py::kwargs>(h);
  KwargsReader nested(kwargs);
  visit(nested);
  nested.CheckAllUsed(absl::StrCat("Runtime(", name, "=...)").c_str());
}

const char* DecisionKindName(omni::Decision::Kind kind) {
  switch (kind) {
    case omni::Decision::kContinue:
      return "continue";
    case omni::Decision::kReconfigured:
      return "reconfigured";
    case omni::Decision::kRedoStep:
      return "redo";
    case omni::Decision::kSaveAndExit:
      return "save_and_exit";
  }
  return "continue";
}

py::dict DecisionDict(const omni::Decision& d) {
  py::dict out;
  out["kind"] = DecisionKindName(d.kind);
  out["rank"] = d.rank;
  out["size"] = d.size;
  out["exit_code"] = d.exit_code;
  out["saved_step"] = d.saved_step;
  out["reason"] = d.reason;
  return out;
}

class PyRuntime final : public Closeable {
 public:
  static std::unique_ptr<PyRuntime> Create(const py::kwargs& kwargs) {
    KwargsReader r(kwargs);
    bool environment = true;
    r.Bool("environment", &environment);
    omni::RuntimeOptions o;
    if (environment) o = ValueOrThrow(omni::RuntimeOptions::FromEnvironment());

    // ---- identity and launcher
    r.Str("source", &o.source);
    r.Str("job_id", &o.job_id);
    r.Int("total_steps", &o.total_steps);
    r.Int("rank", &o.rank);
    r.Int("world_size", &o.world_size);
    r.Int("local_rank", &o.local_rank);
    // ---- telemetry
    Nested(r, "telemetry", [&](KwargsReader& n) { VisitTelemetryOptions(o.telemetry, n); });
    r.Path("step_log", &o.telemetry.step_log_path);
    r.Path("trace", &o.telemetry.trace_path);
    r.Path("forecast_file", &o.forecast_path);
    r.Str("publish_prefix", &o.publish_prefix);
    // ---- checkpoints
    r.Path("ckpt_dir", &o.ckpt_dir);
    r.Int("ckpt_every", &o.ckpt_every);
    r.Duration("ckpt_every_s", &o.ckpt_every_time);
    r.Int("keep_last", &o.keep_last);
    r.Bool("async_ckpt", &o.async_ckpt);
    r.Bool("start_fresh", &o.start_fresh);
    if (const py::handle meta = r.Take("metadata"); meta && !meta.is_none()) {
      if (!PyDict_Check(meta.ptr())) {
        throw py::type_error(
            absl::StrCat("Runtime: metadata must be a dict of str, got ", TypeName(meta)));
      }
      for (auto [k, v] : py::reinterpret_borrow<py::dict>(meta)) {
        if (!PyUnicode_Check(k.ptr()) || !PyUnicode_Check(v.ptr())) {
          throw py::type_error("Runtime: metadata keys and values must be str");
        }
        o.ckpt_metadata[k.cast<std::string>()] = v.cast<std::string>();
      }
    }
    // ---- preemption
    r.Bool("handle_preemption", &o.handle_preemption);
    Nested(r, "preemption", [&](KwargsReader& n) { VisitPreemptionOptions(o.preemption, n); });
    if (!o.preemption.notice_key.empty()) {  // the Runtime owns the store it names
      o.notice_key = o.preemption.notice_key;
      o.preemption.notice_key.clear();
    }
    r.Duration("grace_s", &o.preemption.grace);
    r.Path("notice_file", &o.preemption.notice_file);
    r.Str("notice_key", &o.notice_key);
    // ---- elastic
    py::object store_obj = py::none();
    if (const py::handle s = r.Take("store")) {
      if (s.is_none()) {  // no store, whatever the environment says
        o.store_uri.clear();
      } else if (PyUnicode_Check(s.ptr())) {
        o.store_uri = s.cast<std::string>();
      } else if (py::isinstance<PyStore>(s)) {
        store_obj = py::reinterpret_borrow<py::object>(s);
        o.store = &store_obj.cast<PyStore&>().store();
      } else {
        throw py::type_error(absl::StrCat(
            "Runtime: store must be a URI (str), an omni.Store or None, got ", TypeName(s)));
      }
    }
    Nested(r, "elastic", [&](KwargsReader& n) { VisitElasticOptions(o.elastic, n); });
    r.Str("replica_id", &o.elastic.membership.self.id);
    r.Int("min_replicas", &o.elastic.membership.min_replicas);
    r.Int("max_replicas", &o.elastic.membership.max_replicas);
    r.Str("model_digest", &o.elastic.membership.model_digest);
    r.Bool("leave_on_preempt", &o.leave_on_preempt);
    // ---- data
    Nested(r, "sampler", [&](KwargsReader& n) {
      n.Int("dataset_size", &o.sampler.dataset_size);
      VisitSamplerOptions(o.sampler, n);
    });
    r.Int("dataset_size", &o.sampler.dataset_size);
    VisitSamplerOptions(o.sampler, r);
    // ---- plumbing
    py::object clock_obj = py::none();
    if (const py::handle c = r.Take("clock")) clock_obj = py::reinterpret_borrow<py::object>(c);
    o.clock = ClockArg(clock_obj);
    if (const py::handle log = r.Take("log"); log && !log.is_none()) {
      if (!PyCallable_Check(log.ptr())) {
        throw py::type_error(absl::StrCat("Runtime: log must be callable, got ", TypeName(log)));
      }
      auto fn = std::make_shared<GilOwned>(py::reinterpret_borrow<py::object>(log));
      o.log = [fn](const std::string& line) {
        if (Py_IsInitialized() == 0) return;
        const PyGILState_STATE gil = PyGILState_Ensure();
        try {
          fn->get()(line);
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("omni.Runtime log callback");
        } catch (...) {  // NOLINT(bugprone-empty-catch): a log line is not worth a crash
        }
        PyGILState_Release(gil);
      };
    }
    r.CheckAllUsed("Runtime");

    absl::StatusOr<std::unique_ptr<omni::Runtime>> rt;
    {
      py::gil_scoped_release release;  // opens the store, files, the lock
      rt = omni::Runtime::Create(std::move(o));
    }
    return std::make_unique<PyRuntime>(std::move(store_obj), std::move(clock_obj),
                                       ValueOrThrow(std::move(rt)));
  }

  PyRuntime(py::object store, py::object clock, std::unique_ptr<omni::Runtime> rt)
      : store_(std::move(store)), clock_(std::move(clock)), rt_(std::move(rt)) {}
  ~PyRuntime() override { CloseOnDestruction(); }
  PyRuntime(const PyRuntime&) = delete;
  PyRuntime& operator=(const PyRuntime&) = delete;

  void Register(const std::string& name, py::object object, const std::string& scope) {
    omni::StateScope s = omni::StateScope::kReplicated;
    if (scope == "per_replica") {
      s = omni::StateScope::kPerReplica;
    } else if (scope != "replicated") {
      throw py::value_error(absl::StrCat("Runtime.register('", name,
                                         "'): scope must be 'replicated' or 'per_replica', got '",
                                         scope, "'"));
    }
    omni::Runtime& rt = runtime();
    if (started_) {
      RaiseStatus(absl::FailedPreconditionError(
          absl::StrCat("Runtime.register('", name, "'): state must be registered before start()")));
    }
    if (state_.Contains(name)) {
      throw py::value_error(absl::StrCat("Runtime.register('", name, "'): already registered"));
    }
    // The adapter first (it checks the object's methods); a name the core
    // refuses ("runtime", "data") stays taken here too.
    state_.Register(name, std::move(object));
    const absl::Status st = rt.Register(name, state_.stateful(name), s);
    if (absl::IsAlreadyExists(st)) {
      throw py::value_error(absl::StrCat("Runtime.register: ", st.message()));
    }
    ThrowIfError(st);
  }

  int64_t Start() {
    omni::Runtime& rt = runtime();
    state_.ClearError();
    absl::StatusOr<int64_t> step;
    {
      py::gil_scoped_release release;
      step = rt.Start();
    }
    started_ = true;
    if (!step.ok()) state_.Raise(step.status());
    return *step;
  }

  void BeginStep() { ThrowIfError(runtime().BeginStep()); }

  bool AllReduce(py::handle buffer, const std::string& op) {
    omni::Runtime& rt = runtime();
    const omni::ReduceOp reduce = ReduceOpArg(op);
    BufferView buf;
    AcquireWritable("Runtime.allreduce: buffer", buffer, &buf);
    const omni::DataType type = CommDataTypeOrThrow("Runtime.allreduce: buffer", buf);
    const size_t count = static_cast<size_t>(buf.view().len) / omni::DataTypeSize(type);
    absl::Status st;
    {
      py::gil_scoped_release release;
      st = rt.AllReduce(buf.view().buf, count, type, reduce);
    }
    return st.ok();  // an error is latched: end_step() answers "redo"
  }

  py::dict EndStep() {
    omni::Runtime& rt = runtime();
    state_.ClearError();
    absl::StatusOr<omni::Decision> d;
    {
      py::gil_scoped_release release;
      d = rt.EndStep();
    }
    if (!d.ok()) state_.Raise(d.status());
    return DecisionDict(*d);
  }

  py::dict YieldNow(const std::string& reason) {
    omni::Runtime& rt = runtime();
    state_.ClearError();
    absl::StatusOr<omni::Decision> d;
    {
      py::gil_scoped_release release;
      d = rt.Yield(reason);
    }
    if (!d.ok()) state_.Raise(d.status());
    return DecisionDict(*d);
  }

  std::vector<int64_t> LocalBatch() const { return ValueOrThrow(runtime().LocalBatch()); }

  void Finish() {
    omni::Runtime& rt = runtime();
    absl::Status st;
    {
      py::gil_scoped_release release;
      st = rt.Finish();
    }
    ThrowIfError(st);
  }

  py::object Telemetry(const py::object& self) const {
    return TelemetryView(self, &runtime().telemetry(), alive_);
  }
  py::object Sampler(const py::object& self) const {
    omni::DistributedSampler* s = runtime().sampler();
    if (s == nullptr) return py::none();
    return py::cast(s, py::return_value_policy::reference_internal, self);
  }
  py::object Generation() const {
    omni::ElasticGroup* g = runtime().group();
    if (g == nullptr) return py::none();
    const omni::Generation gen = g->generation();
    py::dict d;
    d["number"] = gen.number;
    d["kind"] = gen.kind;
    d["rank"] = gen.rank;
    d["size"] = gen.size();
    d["description"] = gen.ToString();
    return d;
  }
  bool PreemptionPending() const {
    omni::PreemptionMonitor* m = runtime().preemption();
    return m != nullptr && m->pending();
  }

  omni::Runtime& runtime() const {
    if (rt_ == nullptr) throw std::runtime_error("the Runtime is closed");
    return *rt_;
  }
  bool started() const { return started_; }
  bool closed() const { return rt_ == nullptr; }

  // Destroys the runtime without finish(): the heartbeats stop (the other
  // replicas see this one die), the monitor restores the signal handlers,
  // the telemetry is closed.
  void CloseQuietly() override {
    if (rt_ == nullptr) return;
    *alive_ = false;
    py::gil_scoped_release release;
    rt_.reset();
  }

 private:
  // Declared before rt_, so that they outlive it.
  py::object store_;  // an omni.Store the runtime uses (None for a URI)
  py::object clock_;  // an omni.FakeClock (None for the real clock)
  PyStateRegistry state_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::unique_ptr<omni::Runtime> rt_;
  bool started_ = false;
};

}  // namespace

void DefineRuntime(py::module_& m) {
  py::class_<PyRuntime>(m, "Runtime", "omni::Runtime, the one door; see omni.Runtime.")
      .def(py::init([](const py::kwargs& kwargs) { return PyRuntime::Create(kwargs); }))
      .def("register", &PyRuntime::Register, py::arg("name"), py::arg("obj"),
           py::arg("scope") = "replicated")
      .def("start", &PyRuntime::Start)
      .def("begin_step", &PyRuntime::BeginStep)
      .def("allreduce", &PyRuntime::AllReduce, py::arg("buffer"), py::arg("op") = "sum")
      .def("end_step", &PyRuntime::EndStep)
      .def("yield_now", &PyRuntime::YieldNow, py::arg("reason") = "yielded")
      .def("local_batch", &PyRuntime::LocalBatch)
      .def("finish", &PyRuntime::Finish)
      .def("close", &PyRuntime::CloseQuietly)
      .def_property_readonly(
          "telemetry",
          [](const py::object& self) { return self.cast<const PyRuntime&>().Telemetry(self); })
      .def_property_readonly(
          "sampler",
          [](const py::object& self) { return self.cast<const PyRuntime&>().Sampler(self); })
      .def_property_readonly("generation", &PyRuntime::Generation)
      .def_property_readonly("preemption_pending", &PyRuntime::PreemptionPending)
      .def_property_readonly("step", [](const PyRuntime& r) { return r.runtime().step(); })
      .def_property_readonly("rank", [](const PyRuntime& r) { return r.runtime().rank(); })
      .def_property_readonly("size", [](const PyRuntime& r) { return r.runtime().size(); })
      .def_property_readonly("last_save_s",
                             [](const PyRuntime& r) { return r.runtime().last_save_s(); })
      .def_property_readonly("elastic",
                             [](const PyRuntime& r) { return r.runtime().group() != nullptr; })
      .def_property_readonly("started", &PyRuntime::started)
      .def_property_readonly("closed", &PyRuntime::closed);
}

}  // namespace omni_python
