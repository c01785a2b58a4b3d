// omni._C colocate: the guest side of co-location for Python guests
// (over omni/colocate_gate.h, colocate_guest.h, colocate_channel.h):
// OpenWindow, GuestGate, UnitCostBound, ManualWindowSource,
// ChannelWindowSource (with the host's outlook), GuestStop and run_guest_loop.
//
// Times are nanoseconds (ints) where the C++ API has them, durations in
// seconds (floats) as everywhere in this module. The loop and the sources'
// waits release the GIL; a Python unit runs with it held.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common.h"
#include "omni/colocate_channel.h"
#include "omni/colocate_gate.h"
#include "omni/colocate_guest.h"
#include "omni/colocate_store.h"
#include "store.h"

namespace omni_python {
namespace {

namespace oc = omni::colocate;

absl::Duration Seconds(const char* name, double seconds) {
  return absl::Nanoseconds(SecondsToNanos(name, seconds));
}

py::dict StatsDict(const oc::GateStats& s) {
  py::dict d;
  d["units_started"] = s.units_started;
  d["waits"] = s.waits;
  d["deadline_misses"] = s.deadline_misses;
  d["overruns"] = s.overruns;
  d["overrun_ns"] = s.overrun_ns;
  d["yields"] = s.yields;
  d["yield_p50_ns"] = s.yield_p50_ns;
  d["yield_p99_ns"] = s.yield_p99_ns;
  d["yield_max_ns"] = s.yield_max_ns;
  d["too_short_waits"] = s.too_short_waits;
  d["too_short_windows"] = s.too_short_windows;
  d["too_short_longest_ns"] = s.too_short_longest_ns;
  return d;
}

// A stop flag the Python side sets (any thread) and the loop reads.
struct GuestStopFlag {
  std::atomic<bool> flag{false};
};

py::dict RunLoop(oc::GuestGate& gate, oc::WindowSource& source, const py::object& unit,
                 GuestStopFlag* stop, int64_t max_units, double wait_poll_s, double initial_unit_s,
                 const std::optional<double>& max_wait_s, const py::object& clock) {
  if (!PyCallable_Check(unit.ptr())) {
    throw py::type_error(absl::StrCat("unit must be callable, got ", TypeName(unit)));
  }
  oc::GuestLoopOptions o;
  o.max_units = max_units;
  o.wait_poll = Seconds("wait_poll_s", wait_poll_s);
  o.initial_unit_ns = SecondsToNanos("initial_unit_s", initial_unit_s);
  if (max_wait_s.has_value()) o.max_wait = Seconds("max_wait_s", *max_wait_s);
  const omni::Clock* c = ClockArg(clock);
  GuestStopFlag local;
  const std::atomic<bool>& flag = stop != nullptr ? stop->flag : local.flag;
  std::optional<py::error_already_set> raised;
  const auto call = [&]() -> absl::Status {
    py::gil_scoped_acquire gil;
    try {
      unit();
    } catch (py::error_already_set& e) {
      raised.emplace(std::move(e));
      return absl::AbortedError("the unit raised");
    }
    return absl::OkStatus();
  };
  oc::GuestLoopResult r;
  {
    py::gil_scoped_release release;
    r = oc::RunGuestLoop(gate, source, call, flag, o, c);
  }
  if (raised) throw std::move(*raised);  // NOLINT(misc-throw-by-value-catch-by-reference)
  py::dict d;
  d["why"] = oc::GuestStopName(r.why);
  d["units"] = r.units;
  d["no_window_before_ns"] = r.no_window_before_ns;
  d["waited_ns"] = r.waited_ns;
  d["unit_bound_ns"] = r.unit_bound_ns;
  d["unit_probes"] = r.unit_probes;
  d["unit_forgiven"] = r.unit_forgiven;
  d["stats"] = StatsDict(r.stats);
  return d;
}

}  // namespace

py::dict OutlookDict(const omni::WindowOutlook& o) {
  py::dict d;
  d["state"] = omni::OutlookStateName(o.state);
  d["sequence"] = o.sequence;
  d["made_at_ns"] = o.made_at_ns;
  d["horizon_ns"] = o.horizon_ns;
  d["covered_until_ns"] = o.covered_until_ns;
  d["confidence"] = o.confidence;
  d["last_step"] = o.last_step;
  d["busy_until_ns"] = o.busy_until_ns;
  d["busy_announced_ns"] = o.busy_announced_ns;
  d["writer_closed"] = o.writer_closed;
  py::dict kinds;
  for (int k = 1; k < omni::kNumIdleKinds; ++k) {
    const omni::NextIdleWindow& n = o.next[static_cast<size_t>(k)];
    py::dict w;
    w["outlook"] = omni::KindOutlookName(n.outlook);
    w["windows"] = n.windows;
    w["earliest_start_ns"] = n.earliest_start_ns;
    w["latest_start_ns"] = n.latest_start_ns;
    w["guaranteed_ns"] = n.guaranteed_ns;
    w["expected_ns"] = n.expected_ns;
    w["step"] = n.step;
    w["last_seen_step"] = n.last_seen_step;
    kinds[omni::IdleKindName(static_cast<omni::IdleKind>(k))] = w;
  }
  d["kinds"] = kinds;
  py::list claims;
  for (int i = 0; i < std::min(o.num_claims, omni::kMaxForecastClaims); ++i) {
    const omni::ForecastClaim& c = o.claims[static_cast<size_t>(i)];
    py::dict w;
    w["step"] = c.step;
    w["phase"] = static_cast<int>(c.phase);
    w["kind"] = omni::IdleKindName(c.kind);
    w["ordinal"] = c.ordinal;
    w["before_step"] = c.phase == omni::kBetweenStepsPhase;  // the gap before the step
    w["guaranteed_ns"] = c.guaranteed_ns;
    claims.append(w);
  }
  d["claims"] = claims;
  return d;
}

void DefineColocate(py::module_& m) {
  py::class_<oc::OpenWindow>(m, "OpenWindow",
                             "The host's window open now, as its notices state it (times in ns).")
      .def(py::init([](bool open, uint64_t window_id, int64_t opened_at_ns, int64_t remaining_ns,
                       int64_t as_of_ns, double confidence) {
             return oc::OpenWindow{open,         window_id, opened_at_ns,
                                   remaining_ns, as_of_ns,  confidence};
           }),
           py::arg("open") = false, py::arg("window_id") = 0, py::arg("opened_at_ns") = 0,
           py::arg("remaining_ns") = 0, py::arg("as_of_ns") = 0, py::arg("confidence") = 0.0)
      .def_readwrite("open", &oc::OpenWindow::open)
      .def_readwrite("window_id", &oc::OpenWindow::window_id)
      .def_readwrite("opened_at_ns", &oc::OpenWindow::opened_at_ns)
      .def_readwrite("remaining_ns", &oc::OpenWindow::remaining_ns)
      .def_readwrite("as_of_ns", &oc::OpenWindow::as_of_ns)
      .def_readwrite("confidence", &oc::OpenWindow::confidence)
      .def("__repr__", [](const oc::OpenWindow& w) {
        return absl::StrCat("OpenWindow(open=", w.open ? "True" : "False",
                            ", window_id=", w.window_id, ", remaining_ns=", w.remaining_ns,
                            ", as_of_ns=", w.as_of_ns, ", confidence=", w.confidence, ")");
      });

  py::class_<oc::GuestGate>(m, "GuestGate",
                            "Starts a guest's unit only when the open window's remaining "
                            "duration covers its cost plus a guard (omni/colocate_gate.h).")
      .def(py::init([](double guard_s, double min_confidence, const py::object& clock) {
             oc::GateOptions o;
             o.guard = Seconds("guard_s", guard_s);
             o.min_confidence = min_confidence;
             return ValueOrThrow(oc::GuestGate::Create(o, ClockArg(clock)));
           }),
           py::arg("guard_s") = 0.001, py::arg("min_confidence") = 0.9,
           py::arg("clock") = py::none(), py::keep_alive<1, 4>())
      .def(
          "before_unit",
          [](oc::GuestGate& g, const oc::OpenWindow& w, double unit_cost_s) {
            const oc::GateDecision d = g.BeforeUnit(w, SecondsToNanos("unit_cost_s", unit_cost_s));
            return py::make_tuple(oc::GateVerdictName(d.verdict), d.remaining_ns);
          },
          py::arg("window"), py::arg("unit_cost_s"),
          "(verdict, remaining_ns): 'start', 'wait_no_window', 'wait_low_confidence' or "
          "'wait_too_short'.")
      .def("unit_done", &oc::GuestGate::UnitDone, py::arg("end_ns"),
           "The unit started by the last 'start' ended at end_ns.")
      .def("host_closed", &oc::GuestGate::HostClosed, py::arg("window_id"), py::arg("closed_ns"),
           "The host left window_id (and every earlier one) at closed_ns. Any thread.")
      .def(
          "stats", [](const oc::GuestGate& g) { return StatsDict(g.Stats()); },
          "Units started, waits, yields (p50/p99/max ns) and deadline misses.");

  py::class_<oc::UnitCostBound>(
      m, "UnitCostBound",
      "An upper bound of a unit's cost from the units seen (the first, a warm-up, left "
      "out; initial_s until the second).")
      .def(py::init([](double initial_s, double k, double alpha) {
             return std::make_unique<oc::UnitCostBound>(SecondsToNanos("initial_s", initial_s), k,
                                                        alpha);
           }),
           py::arg("initial_s"), py::arg("k") = 3.0, py::arg("alpha") = 0.1)
      .def("observe", &oc::UnitCostBound::Observe, py::arg("unit_ns"))
      .def("bound_ns", &oc::UnitCostBound::BoundNs)
      .def_property_readonly("count", &oc::UnitCostBound::count);

  py::class_<oc::WindowSource>(m, "WindowSource", "Where a guest reads its host's windows.")
      .def("current", &oc::WindowSource::Current, "The window open now.")
      .def(
          "wait_for_change",
          [](oc::WindowSource& s, double timeout_s) {
            const absl::Duration t = Seconds("timeout_s", timeout_s);
            py::gil_scoped_release release;
            return s.WaitForChange(t);
          },
          py::arg("timeout_s"), "True when the window may have changed; waits at most timeout_s.")
      .def("no_window_before_ns", &oc::WindowSource::NoWindowBeforeNs,
           "The earliest time (ns) a window of the guest's kinds can open, as the host states it "
           "(its forecast, a busy period it announced); 0 when it states nothing.");

  py::class_<oc::ManualWindowSource, oc::WindowSource>(
      m, "ManualWindowSource", "A window source a notices reader sets with open() and close().")
      .def(py::init(
               [](oc::GuestGate* gate) { return std::make_unique<oc::ManualWindowSource>(gate); }),
           py::arg("gate") = nullptr, py::keep_alive<1, 2>())
      .def("open", &oc::ManualWindowSource::Open, py::arg("window"))
      .def("close", &oc::ManualWindowSource::Close, py::arg("window_id"), py::arg("closed_ns"),
           "Closes the window and tells the gate (a unit in flight becomes a yield).")
      .def("set_no_window_before", &oc::ManualWindowSource::SetNoWindowBefore, py::arg("ns"),
           "What the host states about its next window (no_window_before_ns; 0: nothing).");

  py::class_<oc::ChannelWindowSource, oc::WindowSource>(
      m, "ChannelWindowSource",
      "The live window notices of a host on this machine (omni_train --window-channel, or "
      "Telemetry(window_channel=...)).")
      .def_static(
          "open",
          [](const std::string& name, oc::GuestGate* gate, double poll_s,
             const std::string& kinds) {
            oc::ChannelSourceOptions o;
            o.poll = Seconds("poll_s", poll_s);
            o.kinds = ValueOrThrow(oc::ParseKinds(kinds));
            return ValueOrThrow(oc::ChannelWindowSource::Open(name, gate, o));
          },
          py::arg("name"), py::arg("gate") = nullptr, py::arg("poll_s") = 0.0005,
          py::arg("kinds") = "all", py::keep_alive<0, 2>(),
          "Attaches to the channel `name`; FileNotFoundError naming it when no host created it. "
          "`kinds`: the idle kinds used, e.g. 'data_stall' (comma-separated, or 'all').")
      .def(
          "stats",
          [](oc::ChannelWindowSource& s) {
            const oc::ChannelSourceStats st = s.Stats();
            py::dict d;
            d["opens"] = st.opens;
            d["skipped"] = st.skipped;
            d["closes"] = st.closes;
            d["read_errors"] = st.read_errors;
            d["writer_closed"] = st.writer_closed;
            return d;
          },
          "Windows seen open, skipped (kind left out) and closed; whether the host shut down.")
      .def(
          "outlook",
          [](const oc::ChannelWindowSource& s) {
            absl::StatusOr<omni::WindowOutlook> o = s.Outlook();
            return OutlookDict(ValueOrThrow(std::move(o)));
          },
          "The host's outlook: per idle kind the next window its latest forecast lists "
          "('next', 'none' within the horizon, or 'unknown') and a busy period it announced.");

  py::class_<oc::StoreWindowSource, oc::WindowSource>(
      m, "StoreWindowSource",
      "The windows of a host on another machine, from its store keys (omni_train "
      "--publish-prefix, or Runtime(publish_prefix=...)); times on this machine's clock.")
      .def_static(
          "open",
          [](PyStore& store, oc::GuestGate* gate, const std::string& prefix, double poll_s,
             const std::string& kinds) {
            oc::StoreSourceOptions o;
            o.prefix = prefix;
            o.poll = Seconds("poll_s", poll_s);
            o.kinds = ValueOrThrow(oc::ParseKinds(kinds));
            return ValueOrThrow(oc::StoreWindowSource::Open(store.store(), gate, o));
          },
          py::arg("store"), py::arg("gate") = nullptr, py::arg("prefix") = "omni/telemetry",
          py::arg("poll_s") = 0.005, py::arg("kinds") = "all", py::keep_alive<0, 1>(),
          py::keep_alive<0, 2>(),
          "Reads the host's keys <prefix>/window and <prefix>/outlook in `store` (an "
          "omni.Store) every poll_s. A window already open at the first read is not used (its "
          "age is unknown).")
      .def(
          "stats",
          [](oc::StoreWindowSource& s) {
            const oc::StoreSourceStats st = s.Stats();
            py::dict d;
            d["reads"] = st.reads;
            d["opens"] = st.opens;
            d["stale"] = st.stale;
            d["skipped"] = st.skipped;
            d["closes"] = st.closes;
            d["errors"] = st.errors;
            d["last_error"] = st.last_error.ok() ? "" : st.last_error.ToString();
            d["writer_closed"] = st.writer_closed;
            return d;
          },
          "Reads, windows seen open / stale / skipped / closed, errors (the last one), and "
          "whether the host shut down.")
      .def(
          "outlook",
          [](oc::StoreWindowSource& s) { return OutlookDict(ValueOrThrow(s.Outlook())); },
          "The host's outlook as last read, on this machine's clock; FileNotFoundError before "
          "one was read.");

  py::class_<GuestStopFlag>(m, "GuestStop",
                            "A flag that stops run_guest_loop at its next unit boundary.")
      .def(py::init<>())
      .def("set", [](GuestStopFlag& s) { s.flag.store(true); })
      .def("is_set", [](const GuestStopFlag& s) { return s.flag.load(); });

  m.def("run_guest_loop", &RunLoop, py::arg("gate"), py::arg("source"), py::arg("unit"),
        py::arg("stop") = nullptr, py::arg("max_units") = -1, py::arg("wait_poll_s") = 0.05,
        py::arg("initial_unit_s") = 0.05, py::arg("max_wait_s") = py::none(),
        py::arg("clock") = py::none(),
        "Runs unit() whenever the gate allows it in the source's window, waits otherwise; stops "
        "after max_units, when `stop` is set, when unit raises (re-raised), or, with max_wait_s, "
        "when the host states no window of the source's kinds can open within it ('host_busy') "
        "or none could be used for that long ('waited_too_long'). Returns {'why', 'units', "
        "'no_window_before_ns', 'waited_ns', 'unit_bound_ns', 'unit_probes', 'unit_forgiven', "
        "'stats'}: unit_probes units ran at a probe bound after windows were refused as too "
        "short, unit_forgiven of them forgave one slow unit (omni::colocate::UnitCostBound).");
}

}  // namespace omni_python
