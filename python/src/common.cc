// Shared pieces of omni._C; see common.h.

#include "common.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace omni_python {

// ---------------------------------------------------------------- errors

// The one translation of a bad Status into a Python exception.
void RaiseStatus(const absl::Status& status) {
  const std::string message(status.message());
  PyObject* type = nullptr;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      throw py::value_error(message);
    case absl::StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    case absl::StatusCode::kUnavailable:
      type = PyExc_ConnectionError;
      break;
    default:
      throw std::runtime_error(message);  // RuntimeError
  }
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

std::string TypeName(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// ---------------------------------------------------------------- conversions

int64_t SecondsToNanos(const char* name, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds * kNanosPerSecond > 9.0e18) {
    throw py::value_error(absl::StrCat(name,
                                       " must be a finite, non-negative number of seconds, got ",
                                       py::repr(py::float_(seconds)).cast<std::string>()));
  }
  return std::llround(seconds * kNanosPerSecond);
}

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

const omni::Clock* ClockArg(const py::object& clock) {
  if (clock.is_none()) return omni::Clock::Real();
  if (!py::isinstance<omni::FakeClock>(clock)) {
    throw py::type_error(
        absl::StrCat("clock must be None or omni.FakeClock, got ", TypeName(clock)));
  }
  return clock.cast<omni::FakeClock*>();
}

// ---------------------------------------------------------------- options

void KwargsReader::Float(const char* name, double* out) {
  if (py::handle v = Take(name)) {
    if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()))) {
      Wrong(name, "a float", v);
    }
    *out = v.cast<double>();
  }
}

void KwargsReader::Bool(const char* name, bool* out) {
  if (py::handle v = Take(name)) {
    if (!PyBool_Check(v.ptr())) Wrong(name, "a bool", v);
    *out = v.cast<bool>();
  }
}

void KwargsReader::Seconds(const char* name, int64_t* out_ns) {
  if (!Given(name)) return;
  double seconds = 0;
  Float(name, &seconds);
  *out_ns = SecondsToNanos(name, seconds);
}

void KwargsReader::Duration(const char* name, absl::Duration* out) {
  if (!Given(name)) return;
  int64_t ns = 0;
  Seconds(name, &ns);
  *out = absl::Nanoseconds(ns);
}

void KwargsReader::Path(const char* name, std::string* out) {
  if (py::handle v = Take(name)) *out = v.is_none() ? std::string() : PathArg(name, v);
}

void KwargsReader::Str(const char* name, std::string* out) {
  if (py::handle v = Take(name)) {
    if (!PyUnicode_Check(v.ptr())) Wrong(name, "a str", v);
    *out = v.cast<std::string>();
  }
}

py::handle KwargsReader::Take(const char* name) {
  if (!Given(name)) return py::handle();
  used_.insert(name);
  return PyDict_GetItemString(kwargs_.ptr(), name);  // borrowed; kwargs_ holds it
}

bool KwargsReader::Given(const char* name) const {
  return kwargs_ && PyDict_GetItemString(kwargs_.ptr(), name) != nullptr;
}

void KwargsReader::CheckAllUsed(const char* callee) const {
  if (!kwargs_) return;
  for (const auto& item : kwargs_) {
    const std::string key = py::str(item.first);
    if (used_.count(key) == 0) {
      throw py::type_error(
          absl::StrCat(callee, "() got an unexpected keyword argument '", key, "'"));
    }
  }
}

void KwargsReader::Wrong(const char* name, const char* want, py::handle v) {
  throw py::type_error(absl::StrCat(name, " must be ", want, ", got ", TypeName(v)));
}

void KwargsReader::OutOfRange(const char* name, py::handle v) {
  throw py::value_error(absl::StrCat(name, " is out of range: ", py::repr(v).cast<std::string>()));
}

// ---------------------------------------------------------------- buffers

bool BufferView::Acquire(py::handle obj, int flags) {
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
    PyErr_Clear();
    return false;
  }
  held_ = true;
  return true;
}

std::vector<int64_t> BufferView::shape() const {
  std::vector<int64_t> shape;
  shape.reserve(static_cast<size_t>(view_.ndim));
  for (int i = 0; i < view_.ndim; ++i) shape.push_back(view_.shape[i]);
  return shape;
}

// Native and little-endian formats are the same on the hosts Omni supports
// (little-endian); big-endian items are refused.
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

// ---------------------------------------------------------------- live objects

namespace {

// Live Closeables in creation order (GIL-guarded).
std::vector<Closeable*>& LiveObjects() {
  static std::vector<Closeable*> live;
  return live;
}

}  // namespace

Closeable::Closeable() { LiveObjects().push_back(this); }

Closeable::~Closeable() {
  std::vector<Closeable*>& live = LiveObjects();
  for (auto it = live.begin(); it != live.end(); ++it) {
    if (*it == this) {
      live.erase(it);
      break;
    }
  }
}

void CloseAllLiveObjects() {
  // Copied: closing may destroy nothing, but must not invalidate the loop.
  const std::vector<Closeable*> live = LiveObjects();
  for (auto it = live.rbegin(); it != live.rend(); ++it) (*it)->CloseQuietly();
}

}  // namespace omni_python
