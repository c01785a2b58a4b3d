// Shared pieces of omni._C (private to python/src): the one translation of a
// bad absl::Status into a Python exception, unit conversions, keyword-option
// readers, buffer views, and the one registry of live native objects that
// are closed at interpreter exit.
//
// Conventions of every binding file:
//  - A bad absl::Status becomes a Python exception carrying the same message,
//    in one place (RaiseStatus): InvalidArgument -> ValueError, NotFound ->
//    FileNotFoundError, DeadlineExceeded -> TimeoutError, anything else ->
//    RuntimeError.
//  - Durations are float seconds in Python and int64 nanoseconds or
//    absl::Duration in C++.
//  - Options are keyword arguments, read with KwargsReader from a visitor
//    that lists them once (the same visitor reports the defaults).
//  - Every call that may block runs with the GIL released.
//  - No exception, C++ or Python, leaves code that runs on a C++ thread.
//
// Thread safety: everything here is used with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/state.h"
#include "omni/telemetry.h"

namespace omni_python {

namespace py = pybind11;

// ---------------------------------------------------------------- errors

[[noreturn]] void RaiseStatus(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) RaiseStatus(result.status());
  return *std::move(result);
}

std::string TypeName(py::handle h);

// ---------------------------------------------------------------- conversions

constexpr double kNanosPerSecond = 1e9;

// Seconds (a Python option or argument named `name`) to nanoseconds.
// ValueError naming it unless finite, non-negative and representable.
int64_t SecondsToNanos(const char* name, double seconds);
inline double NanosToSeconds(int64_t ns) { return static_cast<double>(ns) / kNanosPerSecond; }
inline absl::Duration SecondsArg(const char* name, double seconds) {
  return absl::Nanoseconds(SecondsToNanos(name, seconds));
}

// str or os.PathLike to a path string; TypeError naming `name` otherwise.
std::string PathArg(const char* name, py::handle value);

py::object JsonLoads(const std::string& json);

// None or an omni.FakeClock (TypeError otherwise) to the clock to use.
const omni::Clock* ClockArg(const py::object& clock);

// ---------------------------------------------------------------- options

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
        OutOfRange(name, v);
      }
    }
  }
  void Float(const char* name, double* out);
  void Bool(const char* name, bool* out);
  void Seconds(const char* name, int64_t* out_ns);
  void Duration(const char* name, absl::Duration* out);
  void Path(const char* name, std::string* out);
  void Str(const char* name, std::string* out);
  // The value of `name` (marking it used), or a null handle when not given.
  py::handle Take(const char* name);
  bool Given(const char* name) const;
  // TypeError for the first keyword no visitor asked for.
  void CheckAllUsed(const char* callee) const;

 private:
  [[noreturn]] static void Wrong(const char* name, const char* want, py::handle v);
  [[noreturn]] static void OutOfRange(const char* name, py::handle v);
  const py::kwargs& kwargs_;
  std::set<std::string> used_;
};

// Writes options into a dict, in Python units (for default_*_options()).
class DictWriter {
 public:
  template <typename T>
  void Int(const char* name, T* v) {
    dict_[name] = *v;
  }
  void Float(const char* name, double* v) { dict_[name] = *v; }
  void Bool(const char* name, bool* v) { dict_[name] = *v; }
  void Seconds(const char* name, int64_t* ns) { dict_[name] = NanosToSeconds(*ns); }
  void Duration(const char* name, absl::Duration* d) { dict_[name] = absl::ToDoubleSeconds(*d); }
  void Path(const char* name, std::string* v) {
    dict_[name] = v->empty() ? py::object(py::none()) : py::object(py::str(*v));
  }
  void Str(const char* name, std::string* v) { dict_[name] = *v; }
  py::dict& dict() { return dict_; }

 private:
  py::dict dict_;
};

// The options of `Options` (visited by `visit`) as a dict of their defaults.
template <typename Options, typename Visit>
py::dict DefaultsDict(const Visit& visit) {
  Options options;
  DictWriter writer;
  visit(options, writer);
  return writer.dict();
}

// ---------------------------------------------------------------- buffers

// A Py_buffer, released when it goes out of scope (with the GIL held).
class BufferView {
 public:
  BufferView() = default;
  ~BufferView() {
    if (held_) PyBuffer_Release(&view_);
  }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  // False (and no Python error set) when `obj` cannot export such a buffer.
  bool Acquire(py::handle obj, int flags);
  const Py_buffer& view() const { return view_; }
  std::vector<int64_t> shape() const;

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// The DType of a buffer item (struct-module format and item size), or
// nullopt. Big-endian items are refused.
std::optional<omni::DType> BufferDType(const char* format, Py_ssize_t itemsize);

// numpy's name of a DType ("bfloat16" has no numpy dtype).
const char* NumpyDTypeName(omni::DType dtype);

// ---------------------------------------------------------------- live objects

// A native object that must be closed before the interpreter finalizes (it
// owns a thread that takes the GIL, a lock file, signal handlers ...).
class Closeable {
 public:
  Closeable();
  virtual ~Closeable();
  Closeable(const Closeable&) = delete;
  Closeable& operator=(const Closeable&) = delete;
  // Closes without raising; idempotent.
  virtual void CloseQuietly() = 0;

 protected:
  // For the destructors of subclasses: CloseQuietly(), and nothing escapes.
  void CloseOnDestruction() noexcept {
    try {
      CloseQuietly();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor cannot report it
    }
  }
};

// Closes every live Closeable, newest first (as destructors would run), at
// interpreter exit. Registered once by the module.
void CloseAllLiveObjects();

// Drops the reference `obj` holds, from any thread, with or without the GIL,
// and never throws (for destructors): the GIL is taken with the C API; once
// the interpreter is finalizing the reference is leaked instead.
inline void DropReference(py::object& obj) noexcept {
  PyObject* ptr = obj.release().ptr();
  if (ptr == nullptr || Py_IsInitialized() == 0) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(ptr);
  PyGILState_Release(gil);
}

// A Python object owned from C++ code that may run without the GIL: the
// reference is dropped with the GIL held.
class GilOwned {
 public:
  explicit GilOwned(py::object obj) : obj_(std::move(obj)) {}
  ~GilOwned() { DropReference(obj_); }
  GilOwned(const GilOwned&) = delete;
  GilOwned& operator=(const GilOwned&) = delete;
  const py::object& get() const { return obj_; }

 private:
  py::object obj_;
};

// ---------------------------------------------------------------- areas

void DefineTelemetry(py::module_& m);
void DefineState(py::module_& m);
void DefineCheckpoints(py::module_& m);
void DefinePreemption(py::module_& m);
void DefineSampler(py::module_& m);
void DefineElastic(py::module_& m);
void DefineRuntime(py::module_& m);
// The host's outlook as a dict (colocate.cc; Telemetry.latest_outlook too).
py::dict OutlookDict(const omni::WindowOutlook& outlook);
// An omni._C.Telemetry over a telemetry that `owner` owns (an omni.Runtime,
// kept alive by the view): every call raises RuntimeError once *alive is
// false (the owner closed).
py::object TelemetryView(py::object owner, omni::Telemetry* telemetry,
                         std::shared_ptr<const bool> alive);
// Registers the tcp:// and env:// store schemes, served by torch's
// TCPStore through omni._torch_store (store.cc).
void RegisterPythonStoreSchemes();

}  // namespace omni_python
