// omni._torch_C: the tcp:// and env:// stores through c10d's C++ TCPStore
// client (omni::torch_ext::TcpStore, include/omni/torch/store.h) instead of
// torch's Python binding, whose compare_set before torch 2.4 builds its
// result without the GIL (PyTorch issue #125990) and so can crash a process
// whose other threads run Python. Built only where omni::torch is (LibTorch
// found); python/omni/_torch_store.py imports it only when the torch of the
// process is the very LibTorch this module links (one copy of libtorch_cpu in
// the process), else it keeps the Python path.
//
// The module exports one attribute, `api`: a PyCapsule (kNativeStoreCapsule,
// python/src/store.h) that omni._C calls without the GIL.
//
// Thread safety: `api` is immutable; OpenTcpStore and the stores it returns
// are thread-safe (omni/torch/store.h).

#include <pybind11/pybind11.h>
#include <torch/version.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "omni/store.h"
#include "omni/torch/store.h"
#include "store.h"

namespace omni_python {
namespace {

absl::StatusOr<std::unique_ptr<omni::Store>> OpenTcp(const std::string& uri) {
  absl::StatusOr<std::unique_ptr<omni::torch_ext::TcpStore>> store =
      omni::torch_ext::OpenTcpStore(uri);
  if (!store.ok()) return store.status();
  return std::unique_ptr<omni::Store>(std::move(*store));
}

const NativeStoreApi kApi{1, &OpenTcp};

}  // namespace
}  // namespace omni_python

PYBIND11_MODULE(_torch_C, m) {
  namespace py = pybind11;
  m.doc() = "omni's tcp:// and env:// stores through c10d's C++ client (private)";
  // The capsule's pointer is to a constant: PyCapsule_GetPointer gives it
  // back as void*, omni._C reads it as const.
  m.attr("api") = py::capsule(const_cast<omni_python::NativeStoreApi*>(&omni_python::kApi),
                              omni_python::kNativeStoreCapsule);
  m.attr("torch_version") = TORCH_VERSION;
}
