// omni._C state objects: the bindings of StateWriter, StateReader and
// StateRegistry (classes in state.h).

#include "state.h"

#include <pybind11/stl.h>

namespace omni_python {

void DefineState(py::module_& m) {
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
}

}  // namespace omni_python
