// omni._C elastic: the rendezvous store (omni.open_store -> omni.Store), the
// communicator on buffers (omni.Communicator) and the elastic group
// (omni.ElasticGroup), over include/omni/{store,comm,elastic}.h as they are.
//
// Buffers: collectives work in place on any object that exports a writable,
// C-contiguous buffer (numpy arrays; torch CPU tensors through .numpy(),
// which the facade does) of float32, float64, int32, int64 or uint8. The
// buffer is held (Py_buffer) for the whole call, which runs with the GIL
// released, so other Python threads run meanwhile.
//
// No LibTorch here: "tcp://" and "env://" stores are served by the user's
// own torch (torch.distributed.TCPStore) through a Python object that
// store.cc adapts to omni::Store (RegisterPythonStoreSchemes).

#include "omni/elastic.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "collectives.h"
#include "common.h"
#include "omni/comm.h"
#include "omni/membership.h"
#include "omni/store.h"
#include "options.h"
#include "state.h"
#include "store.h"

namespace omni_python {
namespace {

// ---------------------------------------------------------------- store

// A value given as bytes, bytearray, a buffer, or str (UTF-8).
std::string ValueArg(const char* method, const std::string& key, py::handle value) {
  if (PyUnicode_Check(value.ptr())) return value.cast<std::string>();
  BufferView buf;
  if (!PyObject_CheckBuffer(value.ptr()) || !buf.Acquire(value, PyBUF_C_CONTIGUOUS)) {
    throw py::type_error(
        absl::StrCat(method, "('", key, "'): value must be bytes or str, got ", TypeName(value)));
  }
  return std::string(static_cast<const char*>(buf.view().buf), static_cast<size_t>(buf.view().len));
}

std::unique_ptr<PyStore> OpenStore(const std::string& uri) {
  absl::StatusOr<std::unique_ptr<omni::Store>> store;
  {
    py::gil_scoped_release release;
    store = omni::OpenStore(uri);
  }
  return std::make_unique<PyStore>(ValueOrThrow(std::move(store)), uri, py::none());
}

// Runs `call` on the store with the GIL released and returns its value.
template <typename Call>
auto Released(const Call& call) {
  py::gil_scoped_release release;
  return call();
}

void DefineStore(py::module_& m) {
  py::class_<PyStore>(m, "Store",
                      "A rendezvous key/value store shared by the processes of a job "
                      "(see omni.open_store).")
      .def(
          "set",
          [](PyStore& s, const std::string& key, py::handle value) {
            const std::string v = ValueArg("set", key, value);
            ThrowIfError(Released([&] { return s.store().Set(key, v); }));
          },
          py::arg("key"), py::arg("value"), "Stores `value` (bytes or str) under `key`.")
      .def(
          "get",
          [](PyStore& s, const std::string& key, double timeout_s) {
            const absl::Duration timeout = SecondsArg("timeout_s", timeout_s);
            return py::bytes(ValueOrThrow(Released([&] { return s.store().Get(key, timeout); })));
          },
          py::arg("key"), py::arg("timeout_s") = 30.0,
          "The value of `key`, waiting up to `timeout_s` for it to exist (TimeoutError "
          "naming the key).")
      .def(
          "try_get",
          [](PyStore& s, const std::string& key) -> py::object {
            std::optional<std::string> v =
                ValueOrThrow(Released([&] { return s.store().TryGet(key); }));
            if (!v) return py::none();
            return py::bytes(*v);
          },
          py::arg("key"), "The value of `key`, or None when it does not exist.")
      .def(
          "add",
          [](PyStore& s, const std::string& key, int64_t delta) {
            return ValueOrThrow(Released([&] { return s.store().Add(key, delta); }));
          },
          py::arg("key"), py::arg("delta") = 1,
          "Atomically adds `delta` to the counter `key` (missing = 0); returns the new value.")
      .def(
          "compare_set",
          [](PyStore& s, const std::string& key, py::handle expected, py::handle desired) {
            const std::string e = ValueArg("compare_set", key, expected);
            const std::string d = ValueArg("compare_set", key, desired);
            return py::bytes(
                ValueOrThrow(Released([&] { return s.store().CompareAndSet(key, e, d); })));
          },
          py::arg("key"), py::arg("expected"), py::arg("desired"),
          "Stores `desired` when `key` holds `expected` (b'' = does not exist); returns the "
          "value stored after the call.")
      .def(
          "wait",
          [](PyStore& s, const std::vector<std::string>& keys, double timeout_s) {
            const absl::Duration timeout = SecondsArg("timeout_s", timeout_s);
            ThrowIfError(Released([&] { return s.store().Wait(keys, timeout); }));
          },
          py::arg("keys"), py::arg("timeout_s") = 30.0,
          "Returns once every key exists; TimeoutError naming the missing ones.")
      .def(
          "delete",
          [](PyStore& s, const std::string& key) {
            return ValueOrThrow(Released([&] { return s.store().Delete(key); }));
          },
          py::arg("key"), "Removes `key`; True when it existed.")
      .def(
          "prefix",
          [](const py::object& self, const std::string& prefix) {
            PyStore& s = self.cast<PyStore&>();
            return std::make_unique<PyStore>(omni::MakePrefixStore(s.store(), prefix),
                                             absl::StrCat(s.uri(), "#", prefix), self);
          },
          py::arg("prefix"),
          "A view in which every key k is stored as prefix + '/' + k (keeps this store alive).")
      .def_property_readonly("uri", &PyStore::uri)
      .def("__repr__", [](const PyStore& s) { return absl::StrCat("<omni.Store ", s.uri(), ">"); });

  m.def("open_store", &OpenStore, py::arg("uri"),
        "Opens a store: 'file:///abs/dir' (a directory shared by the processes), "
        "'tcp://host:port[?server=1&timeout=60s]' or 'env://' (torch.distributed.TCPStore, as "
        "torchrun provides it), 'etcd://...'.");
  m.def("wrap_python_store", &WrapPythonStore, py::arg("impl"), py::arg("label"),
        "An omni.Store over a Python object with omni's store methods (omni._torch_store).");
  m.def(
      "validate_store_key",
      [](const std::string& key) { ThrowIfError(omni::ValidateStoreKey(key)); }, py::arg("key"),
      "ValueError naming `key` unless it is 1..200 characters of [A-Za-z0-9_.-/].");
}

}  // namespace

// ---------------------------------------------------------------- buffers for collectives

std::optional<omni::DType> CommDataType(const Py_buffer& v) {
  const std::optional<omni::DType> dtype = BufferDType(v.format, v.itemsize);
  if (!dtype) return std::nullopt;
  if (*dtype == omni::DType::kBool) return omni::DType::kU8;  // reduced as bytes
  if (omni::DataTypeSize(*dtype) == 0) return std::nullopt;   // not reduced by communicators
  return *dtype;
}

// A writable C-contiguous buffer of `obj` (TypeError / ValueError naming `what`).
void AcquireWritable(const char* what, py::handle obj, BufferView* buf) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(absl::StrCat(what,
                                      " must be a numpy array, a CPU torch tensor or an object "
                                      "with the buffer protocol, got ",
                                      TypeName(obj)));
  }
  if (!buf->Acquire(obj, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) {
    throw py::value_error(absl::StrCat(what, " must be a writable, C-contiguous buffer"));
  }
}

omni::DType CommDataTypeOrThrow(const char* what, const BufferView& buf) {
  const std::optional<omni::DType> type = CommDataType(buf.view());
  if (!type) {
    const Py_buffer& v = buf.view();
    const std::optional<omni::DType> dtype = BufferDType(v.format, v.itemsize);
    const std::string name =
        dtype ? NumpyDTypeName(*dtype)
              : absl::StrCat("buffer format '", v.format == nullptr ? "B" : v.format, "'");
    throw py::value_error(absl::StrCat(what, ": unsupported element type ", name,
                                       "; supported: float32, float64, int32, int64, uint8"));
  }
  return *type;
}

omni::ReduceOp ReduceOpArg(const std::string& op) {
  if (op == "sum") return omni::ReduceOp::kSum;
  if (op == "avg" || op == "mean") return omni::ReduceOp::kAvg;
  if (op == "min") return omni::ReduceOp::kMin;
  if (op == "max") return omni::ReduceOp::kMax;
  throw py::value_error(absl::StrCat("op must be 'sum', 'avg', 'min' or 'max', got '", op, "'"));
}

namespace {

// The collectives on one omni::Communicator with Python buffers; `timeout`
// is used when a call gives none. Each returns the error Status (not raised)
// so that the caller can latch it.
absl::Status AllReduceBuffer(omni::Communicator& c, py::handle buffer, const std::string& op,
                             absl::Duration timeout) {
  const omni::ReduceOp reduce = ReduceOpArg(op);
  BufferView buf;
  AcquireWritable("allreduce: buffer", buffer, &buf);
  const omni::DType type = CommDataTypeOrThrow("allreduce: buffer", buf);
  const size_t count = static_cast<size_t>(buf.view().len) / omni::DataTypeSize(type);
  py::gil_scoped_release release;
  return c.AllReduce(buf.view().buf, count, type, reduce, timeout);
}

absl::Status BroadcastBuffer(omni::Communicator& c, py::handle buffer, int root,
                             absl::Duration timeout) {
  BufferView buf;
  AcquireWritable("broadcast: buffer", buffer, &buf);
  py::gil_scoped_release release;
  return c.Broadcast(buf.view().buf, static_cast<size_t>(buf.view().len), root, timeout);
}

absl::Status AllGatherBuffer(omni::Communicator& c, py::handle in, py::handle out,
                             absl::Duration timeout) {
  BufferView in_buf;
  if (!PyObject_CheckBuffer(in.ptr()) || !in_buf.Acquire(in, PyBUF_C_CONTIGUOUS)) {
    throw py::type_error(
        absl::StrCat("allgather: input must be a C-contiguous buffer, got ", TypeName(in)));
  }
  BufferView out_buf;
  AcquireWritable("allgather: output", out, &out_buf);
  const size_t bytes = static_cast<size_t>(in_buf.view().len);
  const size_t want = bytes * static_cast<size_t>(c.size());
  if (static_cast<size_t>(out_buf.view().len) != want) {
    throw py::value_error(absl::StrCat("allgather: output must hold size() x input = ", want,
                                       " bytes, has ", out_buf.view().len));
  }
  py::gil_scoped_release release;
  return c.AllGather(in_buf.view().buf, bytes, out_buf.view().buf, timeout);
}

// ---------------------------------------------------------------- Communicator

template <typename Visitor>
void VisitCommOptions(omni::CommOptions& o, Visitor& v) {
  v.Str("backend", &o.backend);
  v.Int("rank", &o.rank);
  v.Int("size", &o.size);
  v.Duration("init_timeout_s", &o.init_timeout);
  v.Str("host", &o.host);
  v.Int("device", &o.device);
}

class PyCommunicator final : public Closeable {
 public:
  static std::unique_ptr<PyCommunicator> Create(PyStore& store, const py::kwargs& kwargs) {
    omni::CommOptions options;
    KwargsReader reader(kwargs);
    VisitCommOptions(options, reader);
    absl::Duration timeout = absl::Seconds(60);
    reader.Duration("timeout_s", &timeout);
    reader.CheckAllUsed("Communicator");
    options.store = &store.store();
    absl::StatusOr<std::unique_ptr<omni::Communicator>> comm;
    {
      py::gil_scoped_release release;
      comm = omni::CreateCommunicator(options);
    }
    return std::make_unique<PyCommunicator>(ValueOrThrow(std::move(comm)), timeout);
  }
  PyCommunicator(std::unique_ptr<omni::Communicator> comm, absl::Duration timeout)
      : comm_(std::move(comm)), timeout_(timeout) {}
  ~PyCommunicator() override { CloseOnDestruction(); }

  absl::Duration Timeout(std::optional<double> timeout_s) const {
    return timeout_s ? SecondsArg("timeout_s", *timeout_s) : timeout_;
  }
  omni::Communicator& comm() const {
    if (comm_ == nullptr) throw std::runtime_error("the Communicator is closed");
    return *comm_;
  }
  void CloseQuietly() override {
    if (comm_ == nullptr) return;
    py::gil_scoped_release release;
    comm_.reset();
  }
  bool closed() const { return comm_ == nullptr; }

 private:
  std::unique_ptr<omni::Communicator> comm_;
  absl::Duration timeout_;
};

void DefineCommunicator(py::module_& m) {
  m.def(
      "default_comm_options",
      [] {
        py::dict d = DefaultsDict<omni::CommOptions>(
            [](omni::CommOptions& o, DictWriter& w) { VisitCommOptions(o, w); });
        d["timeout_s"] = 60.0;
        return d;
      },
      "The keyword options of Communicator(store, ...) and their defaults.");
  py::class_<PyCommunicator>(m, "Communicator",
                             "Collectives in place on buffers among `size` ranks.")
      .def(py::init([](PyStore& store, const py::kwargs& kwargs) {
             return PyCommunicator::Create(store, kwargs);
           }),
           py::arg("store"))
      .def(
          "allreduce",
          [](PyCommunicator& c, py::handle buffer, const std::string& op,
             std::optional<double> timeout_s) {
            ThrowIfError(AllReduceBuffer(c.comm(), buffer, op, c.Timeout(timeout_s)));
          },
          py::arg("buffer"), py::arg("op") = "sum", py::arg("timeout_s") = py::none())
      .def(
          "broadcast",
          [](PyCommunicator& c, py::handle buffer, int root, std::optional<double> timeout_s) {
            ThrowIfError(BroadcastBuffer(c.comm(), buffer, root, c.Timeout(timeout_s)));
          },
          py::arg("buffer"), py::arg("root") = 0, py::arg("timeout_s") = py::none())
      .def(
          "allgather",
          [](PyCommunicator& c, py::handle in, py::handle out, std::optional<double> timeout_s) {
            ThrowIfError(AllGatherBuffer(c.comm(), in, out, c.Timeout(timeout_s)));
          },
          py::arg("input"), py::arg("output"), py::arg("timeout_s") = py::none())
      .def(
          "barrier",
          [](PyCommunicator& c, std::optional<double> timeout_s) {
            const absl::Duration timeout = c.Timeout(timeout_s);
            omni::Communicator& comm = c.comm();
            ThrowIfError(Released([&] { return comm.Barrier(timeout); }));
          },
          py::arg("timeout_s") = py::none())
      .def("abort", [](PyCommunicator& c) { c.comm().Abort(); })
      .def_property_readonly("async_error",
                             [](const PyCommunicator& c) -> std::optional<std::string> {
                               const absl::Status st = c.comm().AsyncError();
                               if (st.ok()) return std::nullopt;
                               return st.ToString();
                             })
      .def_property_readonly("rank", [](const PyCommunicator& c) { return c.comm().rank(); })
      .def_property_readonly("size", [](const PyCommunicator& c) { return c.comm().size(); })
      .def_property_readonly(
          "backend", [](const PyCommunicator& c) { return std::string(c.comm().backend()); })
      .def("close", &PyCommunicator::CloseQuietly)
      .def_property_readonly("closed", &PyCommunicator::closed);
}

// ---------------------------------------------------------------- ElasticGroup

py::dict GenerationDict(const omni::Generation& g) {
  py::dict d;
  d["number"] = g.number;
  d["kind"] = omni::GenerationKindName(g.kind);
  d["at_step"] = g.at_step;
  py::list members;
  for (const omni::ReplicaInfo& r : g.members) {
    py::dict member;
    member["id"] = r.id;
    member["host"] = r.host;
    member["rack"] = r.rack;
    member["switch"] = r.switch_name;
    members.append(member);
  }
  d["members"] = members;
  d["joined"] = g.joined;
  d["left"] = g.left;
  d["rank"] = g.rank;
  d["size"] = g.size();
  d["description"] = g.ToString();
  return d;
}

py::dict ChangeDict(const omni::GroupChange& c) {
  py::dict d;
  d["generation"] = GenerationDict(c.generation);
  d["source_rank"] = c.source_rank;
  d["state_received"] = c.state_received;
  d["state_bytes"] = c.state_bytes;
  d["completed"] = c.completed;
  d["agree_ms"] = c.agree_ms;
  d["build_ms"] = c.build_ms;
  d["sync_ms"] = c.sync_ms;
  return d;
}

class PyElasticGroup final : public Closeable {
 public:
  static std::unique_ptr<PyElasticGroup> Create(py::object store, py::object state,
                                                const py::kwargs& kwargs) {
    omni::ElasticOptions options;
    KwargsReader reader(kwargs);
    VisitElasticOptions(options, reader);
    reader.CheckAllUsed("ElasticGroup");
    PyStore& s = store.cast<PyStore&>();
    PyStateRegistry& registry = state.cast<PyStateRegistry&>();
    absl::StatusOr<std::unique_ptr<omni::ElasticGroup>> group;
    {
      py::gil_scoped_release release;
      group = omni::ElasticGroup::Create(s.store(), options, registry.registry());
    }
    return std::make_unique<PyElasticGroup>(std::move(store), std::move(state),
                                            ValueOrThrow(std::move(group)),
                                            options.collective_timeout);
  }
  PyElasticGroup(py::object store, py::object state, std::unique_ptr<omni::ElasticGroup> group,
                 absl::Duration timeout)
      : store_(std::move(store)),
        state_(std::move(state)),
        group_(std::move(group)),
        timeout_(timeout) {}
  ~PyElasticGroup() override { CloseOnDestruction(); }

  // Start / AtBoundary / Recover load the replicated state through Python
  // state objects: their own exceptions are re-raised as they are.
  py::dict Start(int64_t completed) {
    omni::ElasticGroup& g = group();
    PyStateRegistry& state = registry();
    state.ClearError();
    absl::StatusOr<omni::GroupChange> change;
    {
      py::gil_scoped_release release;
      change = g.Start(completed);
    }
    if (!change.ok()) state.Raise(change.status());
    failure_ = absl::OkStatus();
    return ChangeDict(*change);
  }

  py::object AtBoundary(int64_t completed) {
    omni::ElasticGroup& g = group();
    PyStateRegistry& state = registry();
    state.ClearError();
    absl::StatusOr<std::optional<omni::GroupChange>> change;
    {
      py::gil_scoped_release release;
      change = g.AtBoundary(completed);
    }
    if (!change.ok()) state.Raise(change.status());
    if (!change->has_value()) return py::none();
    return ChangeDict(**change);
  }

  py::dict Recover(int64_t completed) {
    omni::ElasticGroup& g = group();
    PyStateRegistry& state = registry();
    state.ClearError();
    const absl::Status failure =
        failure_.ok() ? absl::UnknownError("recover() called by the trainer") : failure_;
    absl::StatusOr<omni::GroupChange> change;
    {
      py::gil_scoped_release release;
      change = g.Recover(failure, completed);
    }
    if (!change.ok()) state.Raise(change.status());
    failure_ = absl::OkStatus();
    return ChangeDict(*change);
  }

  void Leave(int64_t completed) {
    omni::ElasticGroup& g = group();
    ThrowIfError(Released([&] { return g.Leave(completed); }));
  }
  void Finish() {
    omni::ElasticGroup& g = group();
    ThrowIfError(Released([&] { return g.membership().Finish(); }));
  }

  // A collective's error is latched for recover() and raised.
  void Check(const absl::Status& status) {
    if (status.ok()) return;
    failure_ = status;
    RaiseStatus(status);
  }
  absl::Duration Timeout(std::optional<double> timeout_s) const {
    return timeout_s ? SecondsArg("timeout_s", *timeout_s) : timeout_;
  }

  omni::ElasticGroup& group() const {
    if (group_ == nullptr) throw std::runtime_error("the ElasticGroup is closed");
    return *group_;
  }
  void CloseQuietly() override {
    if (group_ == nullptr) return;
    py::gil_scoped_release release;
    group_.reset();  // stops the heartbeats; the others see this replica die
  }
  bool closed() const { return group_ == nullptr; }
  std::optional<std::string> last_failure() const {
    if (failure_.ok()) return std::nullopt;
    return failure_.ToString();
  }

 private:
  PyStateRegistry& registry() const { return state_.cast<PyStateRegistry&>(); }

  py::object store_;  // outlive group_ (declared first)
  py::object state_;
  std::unique_ptr<omni::ElasticGroup> group_;
  absl::Duration timeout_;
  absl::Status failure_;  // the last failed collective, for Recover
};

void DefineElasticGroup(py::module_& m) {
  m.def(
      "default_elastic_options",
      [] {
        return DefaultsDict<omni::ElasticOptions>(
            [](omni::ElasticOptions& o, DictWriter& w) { VisitElasticOptions(o, w); });
      },
      "The keyword options of ElasticGroup(store, state, ...) and their defaults.");
  py::class_<PyElasticGroup>(m, "ElasticGroup",
                             "Elastic data-parallel replicas over a store; see omni.ElasticGroup.")
      .def(py::init([](py::object store, py::object state, const py::kwargs& kwargs) {
             if (!py::isinstance<PyStore>(store)) {
               throw py::type_error(
                   absl::StrCat("store must be an omni.Store, got ", TypeName(store)));
             }
             if (!py::isinstance<PyStateRegistry>(state)) {
               throw py::type_error(
                   absl::StrCat("state must be an omni.StateRegistry, got ", TypeName(state)));
             }
             return PyElasticGroup::Create(std::move(store), std::move(state), kwargs);
           }),
           py::arg("store"), py::arg("state"))
      .def("start", &PyElasticGroup::Start, py::arg("completed") = 0)
      .def("at_boundary", &PyElasticGroup::AtBoundary, py::arg("completed"))
      .def("recover", &PyElasticGroup::Recover, py::arg("completed"))
      .def("leave", &PyElasticGroup::Leave, py::arg("completed"))
      .def("finish", &PyElasticGroup::Finish)
      .def(
          "allreduce",
          [](PyElasticGroup& g, py::handle buffer, const std::string& op,
             std::optional<double> timeout_s) {
            g.Check(AllReduceBuffer(g.group().comm(), buffer, op, g.Timeout(timeout_s)));
          },
          py::arg("buffer"), py::arg("op") = "sum", py::arg("timeout_s") = py::none())
      .def(
          "broadcast",
          [](PyElasticGroup& g, py::handle buffer, int root, std::optional<double> timeout_s) {
            g.Check(BroadcastBuffer(g.group().comm(), buffer, root, g.Timeout(timeout_s)));
          },
          py::arg("buffer"), py::arg("root") = 0, py::arg("timeout_s") = py::none())
      .def(
          "allgather",
          [](PyElasticGroup& g, py::handle in, py::handle out, std::optional<double> timeout_s) {
            g.Check(AllGatherBuffer(g.group().comm(), in, out, g.Timeout(timeout_s)));
          },
          py::arg("input"), py::arg("output"), py::arg("timeout_s") = py::none())
      .def(
          "barrier",
          [](PyElasticGroup& g, std::optional<double> timeout_s) {
            const absl::Duration timeout = g.Timeout(timeout_s);
            omni::Communicator& comm = g.group().comm();
            g.Check(Released([&] { return comm.Barrier(timeout); }));
          },
          py::arg("timeout_s") = py::none())
      .def_property_readonly(
          "generation",
          [](const PyElasticGroup& g) { return GenerationDict(g.group().generation()); })
      .def_property_readonly("rank",
                             [](const PyElasticGroup& g) { return g.group().generation().rank; })
      .def_property_readonly("size",
                             [](const PyElasticGroup& g) { return g.group().generation().size(); })
      .def_property_readonly("dead_peers",
                             [](const PyElasticGroup& g) {
                               omni::ElasticGroup& group = g.group();
                               return Released([&] { return group.membership().DeadPeers(); });
                             })
      .def_property_readonly("heartbeat_error",
                             [](const PyElasticGroup& g) -> std::optional<std::string> {
                               const absl::Status st = g.group().membership().HeartbeatError();
                               if (st.ok()) return std::nullopt;
                               return st.ToString();
                             })
      .def_property_readonly("last_failure", &PyElasticGroup::last_failure)
      .def("close", &PyElasticGroup::CloseQuietly)
      .def_property_readonly("closed", &PyElasticGroup::closed);
}

}  // namespace

void DefineElastic(py::module_& m) {
  DefineStore(m);
  DefineCommunicator(m);
  DefineElasticGroup(m);
}

}  // namespace omni_python
