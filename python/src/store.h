// omni._C store handle (private to python/src): omni.Store, a rendezvous
// store opened by URI (omni.open_store) or a prefix view of another one.
// Shared by elastic.cc (the bindings, the elastic group, communicators) and
// preemption.cc (a notice key in a store).
//
// Thread safety: the handle is used with the GIL held; the omni::Store
// itself is thread-safe (store.h), and every blocking call releases the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "omni/store.h"

namespace omni_python {

namespace py = pybind11;

class PyStore {
 public:
  // `base` keeps the store a prefix view reads through alive (None for a
  // store opened by URI).
  PyStore(std::unique_ptr<omni::Store> store, std::string uri, py::object base)
      : base_(std::move(base)), store_(std::move(store)), uri_(std::move(uri)) {}
  PyStore(const PyStore&) = delete;
  PyStore& operator=(const PyStore&) = delete;

  omni::Store& store() const { return *store_; }
  const std::string& uri() const { return uri_; }

 private:
  py::object base_;  // declared first: outlives store_
  std::unique_ptr<omni::Store> store_;
  std::string uri_;
};

// An omni.Store over a Python object with omni::Store's semantics (the
// methods are listed in store.cc), e.g. omni._torch_store.TorchStore around
// a torch.distributed store. No authentication is added: the object is
// whatever the caller built.
std::unique_ptr<PyStore> WrapPythonStore(py::object impl, const std::string& label);

// What omni._torch_C (python/src/torch_module.cc, built where LibTorch is)
// hands omni._C: c10d's C++ TCPStore client behind tcp:// and env://
// (omni::torch_ext::OpenTcpStore), so that no store call goes through
// torch's Python binding. It travels as the PyCapsule `kNativeStoreCapsule`
// holding a pointer to a NativeStoreApi that lives as long as the process;
// `open` may be called without the GIL, from any thread.
inline constexpr char kNativeStoreCapsule[] = "omni._torch_C.NativeStoreApi";
struct NativeStoreApi {
  int version = 1;  // the layout of this struct; omni._C checks it
  absl::StatusOr<std::unique_ptr<omni::Store>> (*open)(const std::string& uri) = nullptr;
};

}  // namespace omni_python
