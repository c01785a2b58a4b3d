// omni._C: the private native module behind the `omni` Python package. It binds
// omni::core, one area per file:
//   telemetry.cc   Telemetry, step logs, the evaluator, the NCCL probe
//   state.cc/.h    StateWriter / StateReader / StateRegistry (Python state objects)
//   checkpoint.cc  CheckpointManager and the checkpoint tools
//   preemption.cc  PreemptionMonitor
//   sampler.cc     DistributedSampler
//   elastic.cc     Store (open_store), Communicator, ElasticGroup
//   store.cc       an omni::Store over a Python object (tcp://, env:// via torch)
//   runtime.cc     Runtime, the one door (omni::Runtime)
//   options.h      the keyword options of each class, listed once
//   colocate.cc    the co-location guest: GuestGate, window sources, run_guest_loop
//   common.cc/.h   errors, conversions, keyword options, buffers, live objects
// python/omni/__init__.py is the documented facade and python/omni/_C.pyi
// types this module. The conventions every file follows are in common.h.
//
// Thread safety: all state here is touched with the GIL held, except the core
// objects, which are thread-safe where their headers say so.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common.h"
#include "omni/clock.h"
#include "omni/hash.h"
#include "omni/phase.h"
#include "omni/stats.h"
#include "omni/version.h"

namespace omni_python {

void DefineColocate(py::module_& m);  // colocate.cc

namespace {

// XXH3-64 over the bytes of each buffer in turn, as 16 hex digits (the
// digest omni_train prints as params_xxh3).
std::string Xxh3Hex(const py::iterable& buffers) {
  omni::Xxh3 hash;
  for (py::handle b : buffers) {
    BufferView buf;
    if (!PyObject_CheckBuffer(b.ptr()) || !buf.Acquire(b, PyBUF_C_CONTIGUOUS)) {
      throw py::type_error(
          absl::StrCat("xxh3_hex: expected C-contiguous buffers, got ", TypeName(b)));
    }
    py::gil_scoped_release release;
    hash.Update(buf.view().buf, static_cast<size_t>(buf.view().len));
  }
  return omni::HexDigest(hash.Digest());
}

void AdvanceClock(omni::FakeClock& clock, double seconds) {
  clock.Advance(std::chrono::nanoseconds(SecondsToNanos("seconds", seconds)));
}

}  // namespace

void DefineModule(py::module_& m) {
  m.doc() = "Private native module of the omni package (use `import omni`).";
  m.attr("__version__") = omni::Version();

  m.def(
      "version", [] { return std::string(omni::Version()); },
      "The version of the linked omni core library, 'MAJOR.MINOR.PATCH'.");
  m.def("xxh3_hex", &Xxh3Hex, py::arg("buffers"),
        "XXH3-64 of the buffers' bytes in turn, as 16 lowercase hex digits.");
  m.def("build_info", &omni::BuildInfo,
        "One line describing the build: version, Gloo and NCCL availability.");

  py::tuple idle_kinds(omni::kNumIdleKinds);
  for (int i = 0; i < omni::kNumIdleKinds; ++i) {
    idle_kinds[i] = std::string(omni::IdleKindName(static_cast<omni::IdleKind>(i)));
  }
  m.attr("IDLE_KINDS") = idle_kinds;
  py::tuple step_kinds(omni::kNumStepKinds);
  for (int i = 0; i < omni::kNumStepKinds; ++i) {
    step_kinds[i] = std::string(omni::StepKindName(static_cast<omni::StepKind>(i)));
  }
  m.attr("STEP_KINDS") = step_kinds;

  m.attr("DATA_WAIT") = static_cast<int>(omni::phase::kDataWait);
  m.attr("COMPUTE") = static_cast<int>(omni::phase::kCompute);
  m.attr("COMM") = static_cast<int>(omni::phase::kComm);
  m.attr("OPTIMIZER") = static_cast<int>(omni::phase::kOptimizer);
  m.attr("CHECKPOINT") = static_cast<int>(omni::phase::kCheckpoint);
  m.attr("EVAL") = static_cast<int>(omni::phase::kEval);
  m.attr("PIPELINE_BUBBLE") = static_cast<int>(omni::phase::kPipelineBubble);
  m.attr("HOST") = static_cast<int>(omni::phase::kHost);
  m.attr("NUM_BUILTIN_PHASES") = omni::phase::kNumBuiltin;
  m.attr("MAX_PHASES") = omni::kMaxPhases;
  m.attr("MAX_PHASE_DEPTH") = omni::kMaxPhaseDepth;
  m.attr("MAX_SPANS_PER_STEP") = omni::kMaxSpansPerStep;

  py::class_<omni::FakeClock>(m, "FakeClock", "A clock that only moves when told to (for tests).")
      .def(py::init<int64_t>(), py::arg("start_ns") = 1'000'000'000)
      .def("now_ns", &omni::FakeClock::NowNanos, "Current time in nanoseconds.")
      .def("advance", &AdvanceClock, py::arg("seconds"),
           "Moves the clock forward by `seconds` (finite, >= 0).")
      .def(
          "advance_ns",
          [](omni::FakeClock& c, int64_t ns) {
            if (ns < 0) throw py::value_error(absl::StrCat("ns must be >= 0, got ", ns));
            c.Advance(std::chrono::nanoseconds(ns));
          },
          py::arg("ns"), "Moves the clock forward by `ns` nanoseconds.")
      .def("set_ns", &omni::FakeClock::Set, py::arg("ns"), "Sets the time in nanoseconds.");

  DefineTelemetry(m);
  DefineState(m);
  DefineCheckpoints(m);
  DefinePreemption(m);
  DefineSampler(m);
  DefineElastic(m);
  DefineRuntime(m);
  // tcp:// and env:// stores through the user's torch (omni._torch_store).
  RegisterPythonStoreSchemes();
  DefineColocate(m);
  // Closes every live native object (newest first) before the interpreter
  // finalizes: no worker thread then waits for the GIL of a dying interpreter.
  py::module_::import("atexit").attr("register")(py::cpp_function(&CloseAllLiveObjects));
}

}  // namespace omni_python

PYBIND11_MODULE(_C, m) { omni_python::DefineModule(m); }
