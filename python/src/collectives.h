// Python buffers for collectives (private to python/src), shared by the
// communicator and elastic group bindings (elastic.cc) and omni.Runtime
// (runtime.cc): a writable C-contiguous buffer, its element type, and the
// reduce operation named in Python.
//
// Thread safety: with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <string>

#include "common.h"
#include "omni/comm.h"

namespace omni_python {

// The communicator element type of a buffer, or nullopt.
std::optional<omni::DataType> CommDataType(const Py_buffer& v);
// Acquires a writable C-contiguous buffer of `obj` into `buf` (TypeError /
// ValueError naming `what`).
void AcquireWritable(const char* what, py::handle obj, BufferView* buf);
// The buffer's element type; ValueError naming `what` and the type otherwise.
omni::DataType CommDataTypeOrThrow(const char* what, const BufferView& buf);
// "sum", "avg" (or "mean"), "min", "max"; ValueError otherwise.
omni::ReduceOp ReduceOpArg(const std::string& op);

}  // namespace omni_python
