"""Omni: step telemetry and idle-window forecasts for training jobs.

This package is a thin facade over the private native module ``omni._C``
(typed by ``_C.pyi``), which binds the torch-free C++ core::

    import omni

    with omni.Telemetry(step_log="steps.jsonl", forecast_file="forecast.json") as tel:
        for batch_idx in range(num_steps):
            with tel.step():
                with tel.phase(omni.DATA_WAIT):
                    batch = next(loader)
                with tel.phase(omni.COMPUTE):
                    loss = model(batch); loss.backward()
                with tel.phase(omni.OPTIMIZER):
                    opt.step()
        print(tel.snapshot_table())

Errors: a failed call raises the exception of the core's status, with the core's
message: ``ValueError`` for invalid arguments and hook misuse that is an invalid
argument (phases that do not nest, a non-finite duration), ``FileNotFoundError``
for a missing file, ``TimeoutError`` for a timeout, ``ConnectionError`` for a
lost peer, ``RuntimeError`` for everything else (a step ended twice, I/O
errors). Telemetry keeps working after a misuse error.

Durations are float seconds in arguments and options; the snapshot reports
milliseconds (schema in docs/telemetry.md).

The one door, as in C++: ``omni.Runtime`` owns telemetry, checkpoints,
preemption, the store, the elastic group and the sampler, and decides at
each step boundary (see ``omni.runtime``).

Checkpoints and preemption (``omni.CheckpointManager``, ``omni.StateRegistry``,
``omni.PreemptionMonitor``, ``omni.DistributedSampler``; ready-made state
objects for Python's, numpy's and torch's RNGs, numpy arrays and torch modules
in ``omni.state``): see ``omni.checkpoint``. The torch glue
(``omni.TrainState``, ``omni.ResumableBatchSampler``; torch imported lazily):
see ``omni.train``. Elastic data parallelism (``omni.open_store``,
``omni.Communicator``, ``omni.ElasticGroup``): see ``omni.elastic``. A guest
that runs in a critical job's idle windows (``omni.GuestGate``,
``omni.ChannelWindowSource``, ``omni.StoreWindowSource`` for a host on another
machine, ``omni.run_guest_loop``): docs/colocation.md. The whole
API: docs/python.md.
"""

from __future__ import annotations

import time as _time
from typing import Any, Callable, Dict, List, Optional, Union

from . import _C
from ._C import (
    COMM,
    COMPUTE,
    CHECKPOINT,
    DATA_WAIT,
    EVAL,
    HOST,
    IDLE_KINDS,
    MAX_PHASES,
    NUM_BUILTIN_PHASES,
    OPTIMIZER,
    PIPELINE_BUBBLE,
    STEP_KINDS,
    FakeClock,
    build_info,
    default_telemetry_options,
    evaluate,
    nccl_library_version,
    pipeline_bubble_fraction,
    probe_nccl,
    read_step_log,
    version,
)

from ._C import (
    ChannelWindowSource,
    GuestGate,
    GuestStop,
    ManualWindowSource,
    OpenWindow,
    StoreWindowSource,
    UnitCostBound,
    WindowSource,
    run_guest_loop,
)

from . import state
from .files import read_trace
from .files import moved_to as _moved_to
from .files import previous_output as _previous_output
from .train import ResumableBatchSampler, TrainState, params_xxh3
from .runtime import Decision, Runtime
from .elastic import (
    Communicator,
    ElasticGroup,
    Store,
    as_buffer,
    default_comm_options,
    default_elastic_options,
    open_store,
)
from .checkpoint import (
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_NO_SAVE,
    BoundaryDecision,
    CheckpointManager,
    DistributedSampler,
    PreemptionMonitor,
    StateReader,
    StateRegistry,
    StateWriter,
    describe_checkpoint,
    list_checkpoints,
    scan_checkpoints,
    verify_checkpoint,
)

__version__ = _C.__version__

__all__ = [
    "Runtime",
    "Decision",
    "Telemetry",
    "FakeClock",
    "evaluate",
    "read_step_log",
    "pipeline_bubble_fraction",
    "probe_nccl",
    "nccl_library_version",
    "version",
    "build_info",
    "default_telemetry_options",
    "IDLE_KINDS",
    "STEP_KINDS",
    "DATA_WAIT",
    "COMPUTE",
    "COMM",
    "OPTIMIZER",
    "CHECKPOINT",
    "EVAL",
    "PIPELINE_BUBBLE",
    "HOST",
    "NUM_BUILTIN_PHASES",
    "MAX_PHASES",
    # checkpoints and preemption (omni.checkpoint, omni.state)
    "CheckpointManager",
    "StateRegistry",
    "StateWriter",
    "StateReader",
    "DistributedSampler",
    "PreemptionMonitor",
    "BoundaryDecision",
    "list_checkpoints",
    "scan_checkpoints",
    "verify_checkpoint",
    "describe_checkpoint",
    "EXIT_PREEMPTED",
    "EXIT_PREEMPTED_NO_SAVE",
    "state",
    "read_trace",
    # torch glue (omni.train; torch imported lazily)
    "TrainState",
    "ResumableBatchSampler",
    "params_xxh3",
    # elastic data parallelism (omni.elastic)
    "Store",
    "open_store",
    "Communicator",
    "ElasticGroup",
    "as_buffer",
    "default_comm_options",
    "default_elastic_options",
    # co-location guest (docs/colocation.md)
    "OpenWindow",
    "GuestGate",
    "UnitCostBound",
    "WindowSource",
    "ManualWindowSource",
    "ChannelWindowSource",
    "StoreWindowSource",
    "GuestStop",
    "run_guest_loop",
]

Phase = Union[int, str]
"""A phase: a built-in id (``omni.COMPUTE``), a registered id, or a name."""


from ._util import ClosingContext as _ClosingContext
from ._util import add_note as _add_note


class _StepScope:
    """``with tel.step():`` -- begins a step on enter, ends it on exit."""

    __slots__ = ("_tel", "_step")

    def __init__(self, tel: "Telemetry", step: Optional[int]) -> None:
        self._tel = tel
        self._step = step

    def __enter__(self) -> None:
        self._tel.begin_step(self._step)  # misuse raises here

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self._tel.end_step()
            return False
        # The body raised: still end the step, but never hide the body's error
        # behind an error from ending it.
        try:
            self._tel.end_step()
        except Exception as end_error:  # noqa: BLE001
            _add_note(exc, f"omni: ending the step also failed: {end_error}")
        return False


class _PhaseScope:
    """``with tel.phase(p):`` -- begins phase ``p`` on enter, ends it on exit."""

    __slots__ = ("_c", "_phase")

    def __init__(self, c: _C.Telemetry, phase: int) -> None:
        self._c = c
        self._phase = phase

    def __enter__(self) -> None:
        self._c.begin_phase(self._phase)  # misuse raises here

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self._c.end_phase(self._phase)
            return False
        try:
            self._c.end_phase(self._phase)
        except Exception as end_error:  # noqa: BLE001
            _add_note(exc, f"omni: ending the phase also failed: {end_error}")
        return False


class Telemetry(_ClosingContext):
    """Measures every step and its phases, keeps rolling statistics, forecasts
    idle windows, and exports a step log, a Perfetto trace and forecasts.

    Keyword options (all optional; ``omni.default_telemetry_options()`` lists
    them with their defaults; durations in seconds):

    - statistics: ``window`` (steps kept per statistic), ``warmup_min_steps``,
      ``warmup_max_steps``, ``warmup_window``, ``warmup_max_drift`` (steps
      before the step times are stationary are left out);
    - forecasts: ``forecast`` (bool), ``horizon_s``, ``k`` (the stated
      confidence is erf(k/sqrt(2)), 0.954 for k = 2; windows and bounds are
      calibrated to hold at least that often), ``min_window_s``,
      ``max_windows``, ``publish_interval_s`` (0 = after every step);
    - declared periodic events: ``checkpoint_every``, ``checkpoint_offset``,
      ``checkpoint_expected_s``, ``eval_every``, ``eval_offset``,
      ``eval_expected_s``; or by wall time, ``checkpoint_every_s`` /
      ``eval_every_s`` (the event in the first step whose work ends that
      long after the last one began; not with ``*_every``), and
      ``checkpoint_wall_lag_steps`` / ``eval_wall_lag_steps`` (it comes that
      many steps later: 1 where elastic replicas agree on the boundary after
      the next step); an event by steps missing from two of its declared
      steps in a row is no longer forecast there until a declared step has
      it again (its own steps are learned instead);
    - pipeline schedule: ``pipeline_stages``, ``pipeline_micro_batches``,
      ``pipeline_stage``, ``pipeline_backward_over_forward``;
    - exports: ``step_log`` (JSON Lines path), ``trace`` (Chrome trace /
      Perfetto JSON path), ``forecast_file`` (a JSON file replaced atomically
      with every forecast), ``source`` (writer name in the step log);
    - ``window_channel``: a name; live "idle now" / "busy again" notices,
      and with each forecast the next window of each idle kind
      (``latest_outlook``), are published in shared memory under it for
      same-host readers (``omni::WindowChannelReader``, docs/telemetry.md);
      the time between ``end_step`` and the next ``begin_step`` (a batch
      fetched outside the step) is a ``host_side`` window too, once such
      gaps last ``min_window_s``;
    - ``on_existing``: what happens to a non-empty ``step_log`` or ``trace``
      file that exists already (a resumed run's previous attempt):
      ``"rotate"`` (default) moves it to ``<path>.<n>`` (the first free n >=
      1; ``rotated`` lists the new names; the C++ option
      ``keep_previous_outputs``), ``"truncate"`` overwrites it;
    - ``ring_capacity`` (completed steps buffered for the worker, a power of
      two), ``clock`` (``None`` for the steady clock, or an ``omni.FakeClock``
      that the telemetry keeps alive).

    Raises ``ValueError`` naming the option for a bad value, ``TypeError`` for
    an unknown option or a value of the wrong type, and an error naming the
    path when an export file cannot be created.

    The hooks (``step``, ``phase``, ``begin_*``, ``end_*``, ``record_phase``)
    must be called from one thread at a time (the training thread); everything
    else may be called from any thread. Forecasts and sinks are produced on a
    worker thread; ``flush()`` waits for it.
    """

    def __init__(self, *, on_existing: str = "rotate", **options: Any) -> None:
        if on_existing not in ("rotate", "truncate"):
            raise ValueError(f"on_existing must be 'rotate' or 'truncate', got {on_existing!r}")
        # keep_previous_outputs (the C++ option behind on_existing) wins when given.
        rotate = bool(options.pop("keep_previous_outputs", on_existing == "rotate"))
        previous = [_previous_output(options.get(k)) for k in ("step_log", "trace")] if rotate else []
        # The C++ telemetry moves an existing file aside (keep_previous_outputs).
        self._c = _C.Telemetry(keep_previous_outputs=rotate, **options)
        self.rotated: List[str] = [_moved_to(p) for p in previous if p is not None]
        clock = options.get("clock")
        self._now_ns = clock.now_ns if clock is not None else _time.monotonic_ns
        self._step_start_ns: Optional[int] = None
        self.worst_step_s = 0.0
        """The longest step seen by this process (warm-up included): the
        cost of the next step for ``PreemptionMonitor.decide``."""

    @classmethod
    def _of(cls, native: _C.Telemetry) -> "Telemetry":
        """A facade over a native telemetry another object owns (an
        omni.Runtime's)."""
        self = cls.__new__(cls)
        self._c = native
        self.rotated = []
        self._now_ns = _time.monotonic_ns
        self._step_start_ns = None
        self.worst_step_s = 0.0
        return self

    # ---- context managers

    _closing_what = "telemetry"

    def step(self, step: Optional[int] = None) -> _StepScope:
        """A step as a context manager: ``with tel.step(): ...``.

        ``step`` numbers the step (it must be after the previous one); ``None``
        takes the next number. Errors from beginning the step (one already
        open, telemetry closed) raise on entry; the step is ended on exit, and
        an error ending it raises unless the body is already raising.
        """
        return _StepScope(self, step)

    def phase(self, phase: Phase) -> _PhaseScope:
        """A phase inside the current step: ``with tel.phase(omni.COMPUTE): ...``.

        ``phase`` is an id or a registered name (resolved once, here). Errors
        from beginning it raise on entry; it is ended on exit.
        """
        if isinstance(phase, str):
            found = self._c.find_phase(phase)
            if found is None:
                raise ValueError(f"unknown phase '{phase}' (register it with register_phase)")
            phase = found
        return _PhaseScope(self._c, phase)

    # ---- phases

    def register_phase(self, name: str, idle: str = "busy") -> int:
        """Registers a user-named phase and returns its id (or the id of the
        phase already registered under that name with the same idle kind).

        ``idle`` is one of ``omni.IDLE_KINDS``: ``"busy"`` when the devices work
        during the phase, otherwise why they are idle (``"data_stall"``,
        ``"checkpoint"``, ``"eval"``, ``"pipeline_bubble"``, ``"host_side"``).
        Register phases before the training loop.
        """
        return self._c.register_phase(name, idle)

    def find_phase(self, name: str) -> Optional[int]:
        """The id of the phase called ``name``, or ``None``."""
        return self._c.find_phase(name)

    @property
    def phases(self) -> List[Dict[str, Any]]:
        """Every registered phase: ``[{"id", "name", "idle"}, ...]``."""
        return self._c.phases()

    # ---- per-step hooks (the training thread)

    def begin_step(self, step: Optional[int] = None) -> None:
        """Begins step ``step`` (after the previous one) or the next step.
        ``RuntimeError`` while a step is open."""
        self._c.begin_step(step)
        self._step_start_ns = self._now_ns()

    def end_step(self) -> None:
        """Ends the open step. ``RuntimeError`` when none is open."""
        self._c.end_step()
        if self._step_start_ns is not None:
            seconds = (self._now_ns() - self._step_start_ns) / 1e9
            self._step_start_ns = None
            self.worst_step_s = max(self.worst_step_s, seconds)

    def begin_phase(self, phase: Phase) -> None:
        """Begins a phase inside the open step (phases nest)."""
        self._c.begin_phase(phase)

    def end_phase(self, phase: Phase) -> None:
        """Ends ``phase``, which must be the innermost open phase
        (``ValueError`` otherwise; the open phases are left as they were)."""
        self._c.end_phase(phase)

    def end_phase_as(self, phase: Phase, recorded_as: Phase) -> None:
        """Ends ``phase`` as :meth:`end_phase` does, recorded as the phase
        ``recorded_as``: for a phase found to be something else only at its
        end (a save abandoned because another replica failed is host-side
        time, not a save, and must not teach the save bound)."""
        self._c.end_phase_as(phase, recorded_as)

    def record_phase(self, phase: Phase, seconds: float) -> None:
        """Records a phase measured elsewhere (e.g. with CUDA events) that
        ended now and lasted ``seconds``. ``ValueError`` for a non-finite or
        negative duration, or one longer than the enclosing step or phase."""
        self._c.record_phase(phase, seconds)

    # ---- any thread

    def add_callback_sink(self, fn: Callable[[Dict[str, Any]], None], name: str = "callback") -> None:
        """Calls ``fn(forecast_dict)`` with every published forecast, on the
        worker thread (holding the GIL). An exception raised by ``fn`` is
        counted as an export error (see ``counters()``) and never stops
        training. ``fn`` must not call back into this telemetry."""
        self._c.add_callback_sink(fn, name)

    def add_store_sink(self, store: "Store", prefix: str = "omni/telemetry") -> None:
        """Publishes every forecast, window notice and outlook under
        ``prefix`` in ``store`` (an ``omni.Store``: ``omni.open_store``) for
        guests on other hosts, which read them with
        ``omni.StoreWindowSource``. ``ValueError`` naming the key when the
        prefix makes no valid store key. The store is kept alive as long as
        this telemetry."""
        self._c.add_store_sink(store, prefix)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Waits until the worker has processed every completed step (and
        published a forecast if one is due). ``TimeoutError`` on timeout."""
        self._c.flush(timeout_s)

    def snapshot(self) -> Dict[str, Any]:
        """The rolling statistics as a dict (durations in milliseconds)."""
        return self._c.snapshot()

    def snapshot_table(self) -> str:
        """The rolling statistics as a fixed-width table."""
        return self._c.snapshot_table()

    def latest_forecast(self) -> Optional[Dict[str, Any]]:
        """The most recent forecast (schema ``omni.forecast``), or ``None``
        before the step times are stationary or when forecasting is off."""
        return self._c.latest_forecast()

    def announce_busy(self, until_ns: int) -> None:
        """States that none of this job's idle windows opens before
        ``until_ns`` (this telemetry's clock; ``time.monotonic_ns()`` for the
        default one): a long stretch without idle time its forecast cannot
        know. Guests reading the ``window_channel`` may leave instead of
        waiting (docs/colocation.md). 0 withdraws it; ``ValueError`` for a
        negative time."""
        self._c.announce_busy(until_ns)

    def latest_outlook(self) -> Dict[str, Any]:
        """What the window channel tells guests about this job's next idle
        windows: ``state`` ("none", "forecast", "withdrawn"), the forecast's
        ``made_at_ns`` / ``horizon_ns`` / ``covered_until_ns``, the announced
        ``busy_until_ns``, and per idle kind in ``kinds`` its ``outlook``
        ("next" with ``earliest_start_ns`` etc., "none" within the horizon,
        or "unknown")."""
        return self._c.latest_outlook()

    def counters(self) -> Dict[str, Any]:
        """Steps recorded / dropped, misuse and export errors, forecasts
        published, and the most recent error (``last_error``, "" if none)."""
        return self._c.counters()

    @property
    def forecast_options(self) -> Dict[str, Any]:
        """The forecast options in effect (horizon, k, events, pipeline)."""
        return self._c.options()

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        """Drains the remaining steps, closes the step log and trace (fsynced)
        and stops the worker. Raises the first export error seen, if any.
        Idempotent; the hooks raise ``RuntimeError`` afterwards."""
        self._c.close()

    @property
    def native(self) -> _C.Telemetry:
        """The underlying ``omni._C.Telemetry`` (no facade overhead)."""
        return self._c

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<omni.Telemetry {state}>"
