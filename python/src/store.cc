// omni._C store adaptor: an omni::Store whose operations are methods of a
// Python object, so that the user's own torch serves tcp:// and env://
// (torch.distributed.TCPStore, torchrun's rendezvous store) without omni._C
// linking LibTorch. Where omni._torch_C is built and the process's torch is
// the LibTorch it links, tcp:// and env:// use its C++ client instead (see
// OpenPythonStore); the Python object then serves only torch store objects
// given to omni.open_store and builds without LibTorch. The c10d mapping itself (atomic reads by
// compare-set probes, counters checked before add, one call at a time on a connection) is
// python/omni/_torch_store.py; this file only crosses the language boundary.
//
// The Python object has omni::Store's semantics (store.h):
//   set(key, value: bytes) -> None
//   try_get(key) -> bytes | None          never blocks
//   add(key, delta: int) -> int
//   compare_set(key, expected: bytes, desired: bytes) -> bytes
//   delete(key) -> bool
//   check(keys: list[str]) -> bool         every key exists (never blocks)
//   exposure() -> (remote: str, wildcard: str)
// and raises KeyError (-> NotFound), ValueError / TypeError (->
// InvalidArgument), OverflowError (-> OutOfRange), TimeoutError (->
// DeadlineExceeded), PermissionError (-> PermissionDenied); anything else
// (a lost connection) is Unavailable, which the elastic runtime treats as a
// store failure.
//
// GIL: every method takes the GIL (PyGILState, so from any C++ thread: the
// elastic group's heartbeat thread, the communicator's rendezvous) only for
// the Python call itself; Get and Wait poll `check` and sleep without it.
// The Python object's own calls into torch release the GIL while they wait
// on the network. Once the interpreter is finalizing, every call fails with
// Unavailable instead of touching Python.
//
// Thread safety: every method may be called from any thread concurrently
// (the Python object serialises its connection).

#include "omni/store.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common.h"
#include "store.h"

namespace omni_python {
namespace {

constexpr absl::Duration kMinBackoff = absl::Microseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Milliseconds(2);

absl::Status StatusOfPythonStoreError(const py::error_already_set& e, const std::string& where) {
  const std::string message = absl::StrCat(where, ": ", e.what());
  if (e.matches(PyExc_KeyError)) return absl::NotFoundError(message);
  if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError)) {
    return absl::InvalidArgumentError(message);
  }
  if (e.matches(PyExc_OverflowError)) return absl::OutOfRangeError(message);
  if (e.matches(PyExc_TimeoutError)) return absl::DeadlineExceededError(message);
  if (e.matches(PyExc_PermissionError)) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

class PythonStore final : public omni::Store {
 public:
  PythonStore(py::object impl, std::string label)
      : impl_(std::move(impl)), label_(std::move(label)) {}
  ~PythonStore() override = default;  // GilOwned drops the object with the GIL
  PythonStore(const PythonStore&) = delete;
  PythonStore& operator=(const PythonStore&) = delete;

  absl::Status Set(const std::string& key, const std::string& value) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<bool>("set", key,
                      [&](const py::object& o) {
                        o.attr("set")(key, py::bytes(value));
                        return true;
                      })
        .status();
  }

  absl::StatusOr<std::optional<std::string>> TryGet(const std::string& key) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<std::optional<std::string>>("try_get", key, [&](const py::object& o) {
      py::object v = o.attr("try_get")(key);
      if (v.is_none()) return std::optional<std::string>();
      return std::optional<std::string>(v.cast<std::string>());
    });
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<int64_t>(
        "add", key, [&](const py::object& o) { return o.attr("add")(key, delta).cast<int64_t>(); });
  }

  absl::StatusOr<std::string> CompareAndSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<std::string>("compare_set", key, [&](const py::object& o) {
      return o.attr("compare_set")(key, py::bytes(expected), py::bytes(desired))
          .cast<std::string>();
    });
  }

  absl::StatusOr<bool> Delete(const std::string& key) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    return Call<bool>("delete", key,
                      [&](const py::object& o) { return o.attr("delete")(key).cast<bool>(); });
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = kMinBackoff;
    for (;;) {
      absl::StatusOr<bool> exists = Check({key});
      if (!exists.ok()) return exists.status();
      if (*exists) {
        absl::StatusOr<std::optional<std::string>> value = TryGet(key);
        if (!value.ok()) return value.status();
        if (value->has_value()) return std::move(**value);  // else deleted meanwhile
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(absl::StrCat(
            label_, ": key '", key, "' still missing after ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(std::min(backoff, left));  // without the GIL
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    for (const std::string& key : keys) {
      if (absl::Status st = omni::ValidateStoreKey(key); !st.ok()) return st;
    }
    if (keys.empty()) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration backoff = kMinBackoff;
    for (;;) {
      absl::StatusOr<bool> all = Check(keys);
      if (!all.ok()) return all.status();
      if (*all) return absl::OkStatus();
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      absl::SleepFor(std::min(backoff, left));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      absl::StatusOr<bool> exists = Check({key});
      if (!exists.ok()) return exists.status();
      if (!*exists) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat(label_, ": key(s) '", absl::StrJoin(missing, "', '"), "' still missing after ",
                     absl::FormatDuration(timeout)));
  }

  Exposure exposure() const override {
    Exposure e;
    absl::StatusOr<bool> done = Call<bool>("exposure", "", [&](const py::object& o) {
      if (!py::hasattr(o, "exposure")) return true;
      auto [remote, wildcard] = o.attr("exposure")().cast<std::pair<std::string, std::string>>();
      e.remote = std::move(remote);
      e.wildcard = std::move(wildcard);
      return true;
    });
    // Unknown exposure is reported as remote: OpenStore then asks for a secret.
    if (!done.ok())
      e.remote = absl::StrCat(label_, " (exposure unknown: ", done.status().message(), ")");
    return e;
  }

 private:
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) const {
    return Call<bool>("check", absl::StrJoin(keys, "', '"),
                      [&](const py::object& o) { return o.attr("check")(keys).cast<bool>(); });
  }

  // Runs `op` on the Python object with the GIL held; nothing it raises
  // escapes (a Python exception becomes the Status above, a C++ one
  // Internal).
  template <typename T, typename Op>
  absl::StatusOr<T> Call(const char* what, const std::string& key, const Op& op) const {
    const std::string where = absl::StrCat(label_, ": ", what, " of key '", key, "'");
    if (Py_IsInitialized() == 0 || _Py_IsFinalizing() != 0) {
      return absl::UnavailableError(absl::StrCat(where, ": the Python interpreter is exiting"));
    }
    const PyGILState_STATE gil = PyGILState_Ensure();
    absl::StatusOr<T> result;
    try {
      result = T(op(impl_.get()));
    } catch (py::error_already_set& e) {
      result = StatusOfPythonStoreError(e, where);
      e.restore();
      PyErr_Clear();
    } catch (const std::exception& e) {
      result = absl::InternalError(absl::StrCat(where, ": ", e.what()));
    }
    PyGILState_Release(gil);
    return result;
  }

  GilOwned impl_;
  const std::string label_;
};

// The factory behind tcp:// and env://: omni._torch_store.open(uri) checks
// the URI and returns omni._torch_C's native opener (a capsule, called here
// without the GIL) where the process's torch is the LibTorch it links, else
// the Python object (connecting, or serving with server=1).
absl::StatusOr<std::unique_ptr<omni::Store>> OpenPythonStore(const std::string& uri) {
  if (Py_IsInitialized() == 0 || _Py_IsFinalizing() != 0) {
    return absl::UnavailableError(
        absl::StrCat("store '", uri, "': the Python interpreter is exiting"));
  }
  const PyGILState_STATE gil = PyGILState_Ensure();
  absl::StatusOr<std::unique_ptr<omni::Store>> result;
  const NativeStoreApi* native = nullptr;
  try {
    py::object impl = py::module_::import("omni._torch_store").attr("open")(uri);
    if (PyCapsule_CheckExact(impl.ptr()) != 0) {
      // Another capsule name raises ValueError: caught below.
      native =
          static_cast<const NativeStoreApi*>(PyCapsule_GetPointer(impl.ptr(), kNativeStoreCapsule));
      if (native == nullptr) throw py::error_already_set();
      if (native->version != 1 || native->open == nullptr) {
        native = nullptr;
        result = absl::InternalError(absl::StrCat(
            "store '", uri, "': omni._torch_C is not from this build of omni._C (reinstall)"));
      }
    } else {
      std::string label = py::str(impl.attr("label")).cast<std::string>();
      result = std::unique_ptr<omni::Store>(
          std::make_unique<PythonStore>(std::move(impl), std::move(label)));
    }
  } catch (py::error_already_set& e) {
    const std::string where = absl::StrCat("store '", uri, "'");
    result = e.matches(PyExc_ImportError)
                 ? absl::UnimplementedError(absl::StrCat(
                       where, ": tcp:// and env:// need torch.distributed: ", e.what()))
                 : StatusOfPythonStoreError(e, where);
    e.restore();
    PyErr_Clear();
  } catch (const std::exception& e) {
    result = absl::InternalError(absl::StrCat("store '", uri, "': ", e.what()));
  }
  PyGILState_Release(gil);
  // Connecting (or starting the server) waits on the network: not under the
  // GIL, so that the caller's other threads run meanwhile.
  if (native != nullptr) return native->open(uri);
  return result;
}

}  // namespace

void RegisterPythonStoreSchemes() {
  for (const char* scheme : {"tcp", "env"}) {
    ThrowIfError(omni::RegisterStoreScheme(scheme, &OpenPythonStore));
  }
}

std::unique_ptr<PyStore> WrapPythonStore(py::object impl, const std::string& label) {
  return std::make_unique<PyStore>(std::make_unique<PythonStore>(std::move(impl), label), label,
                                   py::none());
}

}  // namespace omni_python
