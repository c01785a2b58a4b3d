// omni._C state objects (private to python/src): the writer and reader
// handed to a Python object's save(writer) / load(reader), the adapter that
// makes a Python object an omni::Stateful, and omni.StateRegistry. Used by
// checkpoints (checkpoint.cc) and the elastic group's replicated state
// (elastic.cc).
//
// Python state objects are wrapped in a C++ omni::Stateful
// (PyStatefulAdapter) that the core calls with the GIL released, on the
// thread that called save / restore / the elastic group; the adapter takes
// the GIL, and turns whatever the object raises into a Status (the exception
// itself is re-raised to the caller once the core returns). Writer and
// reader handles are valid only during that call.
//
// Thread safety: GIL-guarded, like everything in omni._C.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common.h"
#include "omni/sampler.h"
#include "omni/state.h"

namespace omni_python {

inline omni::DType BufferDTypeOrThrow(const char* method, const std::string& key,
                                      const BufferView& buf) {
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

inline absl::Status StatusOfPythonError(const py::error_already_set& e, const std::string& where) {
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
  ~PyStatefulAdapter() override { DropReference(object_); }
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
    statefuls_.push_back(stateful);
    adapters_.push_back(std::move(adapter));
    return object;
  }
  // The core's view of the object registered under `name` (null if none).
  omni::Stateful* stateful(const std::string& name) const {
    for (size_t i = 0; i < objects_.size(); ++i) {
      if (objects_[i].first == name) return statefuls_[i];
    }
    return nullptr;
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
  std::vector<omni::Stateful*> statefuls_;                    // parallel to objects_
  std::vector<std::unique_ptr<PyStatefulAdapter>> adapters_;  // null for native objects
};

}  // namespace omni_python
