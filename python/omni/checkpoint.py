"""Checkpoints, the training state and preemption: a Python trainer that is
preemptible without loss.

    import omni
    from omni.state import ArrayState, JsonState, NumpyRandomState, PythonRandomState

    state = omni.StateRegistry()
    state.register("model", ArrayState(weights))          # numpy arrays, restored in place
    state.register("progress", JsonState({"step": 0}))
    state.register("rng/python", PythonRandomState())
    state.register("rng/numpy", NumpyRandomState())
    state.register("data", omni.DistributedSampler(len(dataset), global_batch=32, seed=1))

    with omni.CheckpointManager("ckpt", keep_last=3) as ckpt, omni.PreemptionMonitor() as pm:
        restored = ckpt.restore(state)                    # None on the first run
        first = 0 if restored is None else restored["step"] + 1
        for step in range(first, steps):
            train_step(...)
            decision = pm.at_boundary(step_s, save_mean_s=save_s)
            if decision.action == "save_and_exit":
                ckpt.save(step, state)
                raise SystemExit(omni.EXIT_PREEMPTED)     # 75: resumable
            if decision.action == "exit_without_save":
                raise SystemExit(omni.EXIT_PREEMPTED_NO_SAVE)  # 76
            if step % 100 == 99:
                ckpt.save_async(step, state)

On-disk format, retention, verification and the preemption rules are those
of the C++ core (docs/preemption.md, include/omni/checkpoint.h).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Union

from . import _C
from ._C import (
    EXIT_PREEMPTED,
    EXIT_PREEMPTED_NO_SAVE,
    DistributedSampler,
    StateReader,
    StateRegistry,
    StateWriter,
    describe_checkpoint,
    list_checkpoints,
    scan_checkpoints,
    verify_checkpoint,
)

__all__ = [
    "CheckpointManager",
    "PreemptionMonitor",
    "BoundaryDecision",
    "StateRegistry",
    "StateWriter",
    "StateReader",
    "DistributedSampler",
    "list_checkpoints",
    "scan_checkpoints",
    "verify_checkpoint",
    "describe_checkpoint",
    "EXIT_PREEMPTED",
    "EXIT_PREEMPTED_NO_SAVE",
]

_Path = Union[str, "os.PathLike[str]"]
State = Union[StateRegistry, Mapping[str, Any]]
"""A StateRegistry, or a mapping {name: state object} (registered in order)."""


def _registry(state: State) -> StateRegistry:
    if isinstance(state, StateRegistry):
        return state
    if isinstance(state, Mapping):
        registry = StateRegistry()
        for name, obj in state.items():
            registry.register(name, obj)
        return registry
    raise TypeError(
        f"state must be an omni.StateRegistry or a mapping of name to state object, "
        f"got {type(state).__name__}"
    )


from ._util import ClosingContext as _ClosingContext


def _flatten_config(config: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """{"optim": {"lr": 0.1}} -> {"optim.lr": 0.1}, JSON-normalised (tuples
    become lists) so that a value compares equal to itself after a round trip."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping, got {type(config).__name__}")
    flat: Dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_config(value, name + "."))
        else:
            flat[name] = json.loads(json.dumps(value))
    return flat


class CheckpointManager(_ClosingContext):
    """The checkpoints of one rank under ``dir`` (created if missing).

    Options: ``rank`` / ``world_size`` (ranks sharing ``dir``), ``job_id``
    (a restore refuses another job's checkpoint), retention ``keep_last``
    (>= 1) and ``keep_every`` (also keep every step that is a multiple; 0 =
    none), ``max_snapshot_bytes`` (a larger state is saved synchronously by
    ``save_async``), ``keep_snapshot_memory`` (keep the snapshot's host
    memory for the next ``save_async``, or return it after every write),
    ``wait_for_pending`` (``save_async`` while one is being written: wait, or
    skip the new one), ``shard_timeout_s``, ``start_fresh`` (see
    ``restore``), ``direct_io`` (write shards with O_DIRECT where the file
    system allows it; off by default, see docs/preemption.md; the files are
    the same either way).

    ``read_only=True`` opens ``dir`` only to read it: no lock (so it works
    beside a live writer, or on a directory nobody may write to), no clean-up
    of a crashed writer's temporary files, no retention; ``save`` and
    ``save_async`` raise ``RuntimeError`` saying the directory is read-only;
    ``list`` and ``restore`` work as usual. ``dir`` must exist
    (``FileNotFoundError`` otherwise).

    ``config``: the run's configuration (a JSON-like mapping, nested dicts
    allowed). Every save records it (metadata key ``config``); ``restore``
    compares it with the checkpoint it is about to load and raises
    ``ValueError`` naming every field that differs, with both values
    (checkpoints written without one are accepted).

    Step ids are unique: saving a step that already exists in ``dir`` raises
    ``FileExistsError`` unless ``overwrite=True`` is passed.

    Opening (unless ``read_only``) takes a writer lock on (dir, rank): ``RuntimeError`` naming the
    directory when another live process holds it. Use from one thread.
    ``save``, ``restore`` and ``wait_for_pending`` release the GIL; the state
    objects' ``save`` / ``load`` run on the calling thread, holding it.

    Errors: an exception raised by a state object's ``save`` / ``load``
    propagates as it is (with the core's message as a note); otherwise
    ``ValueError`` (invalid argument, other shapes), ``FileNotFoundError``
    (a missing checkpoint or state key) or ``RuntimeError`` (I/O, a full
    disk, corruption).
    """

    def __init__(
        self,
        dir: _Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        job_id: str = "",
        keep_last: int = 3,
        keep_every: int = 0,
        max_snapshot_bytes: int = 8 << 30,
        wait_for_pending: bool = True,
        shard_timeout_s: float = 300.0,
        keep_snapshot_memory: bool = True,
        start_fresh: bool = False,
        direct_io: bool = False,
        read_only: bool = False,
        config: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self._config = None if config is None else _flatten_config(config)
        self._steps: Optional[set] = None  # steps known to exist (lazily listed)
        self.save_times_s: List[float] = []  # the last synchronous saves' durations
        self.last_save_bytes = 0
        self._c = _C.CheckpointManager(
            dir, rank=rank, world_size=world_size, job_id=job_id, keep_last=keep_last,
            keep_every=keep_every, max_snapshot_bytes=max_snapshot_bytes,
            wait_for_pending=wait_for_pending, shard_timeout_s=shard_timeout_s,
            keep_snapshot_memory=keep_snapshot_memory, start_fresh=start_fresh,
            direct_io=direct_io, read_only=read_only,
        )
        self.read_only = read_only

    @classmethod
    def open(cls, dir: _Path, **options: Any) -> "CheckpointManager":
        """Same as ``CheckpointManager(dir, **options)``."""
        return cls(dir, **options)

    def save(self, step: int, state: State, metadata: Optional[Dict[str, str]] = None, *,
             overwrite: bool = False) -> Dict[str, Any]:
        """Saves ``state`` as checkpoint ``step`` (0 <= step < 10**12); durable
        when it returns. Returns ``{"bytes", "snapshot_s", "write_s",
        "background", "skipped"}``. Waits for a pending ``save_async`` first.
        On error every earlier checkpoint is untouched. ``FileExistsError``
        when ``step`` exists (unless ``overwrite``)."""
        meta = self._prepare(step, metadata, overwrite)
        stats = self._c.save(step, _registry(state), meta)
        self._steps.add(step)
        self.save_times_s.append(stats["snapshot_s"] + stats["write_s"])
        del self.save_times_s[:-20]
        self.last_save_bytes = stats["bytes"]
        return stats

    def save_async(
        self, step: int, state: State, metadata: Optional[Dict[str, str]] = None, *,
        overwrite: bool = False,
    ) -> Dict[str, Any]:
        """Copies ``state`` now and writes it on a background thread
        (``background`` True; ``snapshot_s`` is the time the caller was
        blocked). An error of the background write is raised by the next
        ``save_async`` or ``wait_for_pending``. ``FileExistsError`` as
        ``save``."""
        meta = self._prepare(step, metadata, overwrite)
        stats = self._c.save_async(step, _registry(state), meta)
        if not stats.get("skipped"):
            self._steps.add(step)
        return stats

    def _prepare(self, step: int, metadata: Optional[Dict[str, str]],
                 overwrite: bool) -> Optional[Dict[str, str]]:
        """The metadata to save (with the config), after refusing an
        existing step id."""
        if self.read_only:
            self._c.save(step, StateRegistry(), {})  # raises the core's read-only error
        if self._steps is None:
            self._steps = {info["step"] for info in self._c.list()}
        if not overwrite and step in self._steps:
            # Retention may have removed it meanwhile: look again.
            self._steps = {info["step"] for info in self._c.list()}
            if step in self._steps:
                raise FileExistsError(
                    f"checkpoint step {step} already exists in {self.dir}; pass overwrite=True "
                    "to replace it"
                )
        if self._config is None:
            return metadata
        meta = dict(metadata or {})
        meta["config"] = json.dumps(self._config, sort_keys=True)
        return meta

    def check_config(self, info: Mapping[str, Any]) -> None:
        """``ValueError`` naming every field of ``config`` that differs from
        the one recorded in the checkpoint ``info`` (an entry of
        ``list()``); nothing when either has none."""
        recorded = info.get("metadata", {}).get("config")
        if self._config is None or recorded is None:
            return
        saved = json.loads(recorded)
        diffs = []
        for key in sorted(set(saved) | set(self._config)):
            if key not in saved:
                diffs.append(f"{key}: not in the checkpoint, {self._config[key]!r} in this run")
            elif key not in self._config:
                diffs.append(f"{key}: {saved[key]!r} in the checkpoint, not in this run")
            elif saved[key] != self._config[key]:
                diffs.append(f"{key}: {saved[key]!r} in the checkpoint, "
                             f"{self._config[key]!r} in this run")
        if diffs:
            raise ValueError(
                f"checkpoint step {info['step']} in {self.dir} was written with another "
                f"configuration ({len(diffs)} field(s) differ): " + "; ".join(diffs)
            )

    def wait_for_pending(self, timeout_s: Optional[float] = None) -> None:
        """Waits for a pending ``save_async`` and raises its error, if any
        (``TimeoutError`` naming the step after ``timeout_s``)."""
        self._c.wait_for_pending(timeout_s)

    def list(self) -> List[Dict[str, Any]]:
        """Valid checkpoints, newest first: ``{"step", "path", "world_size",
        "format_version", "library_version", "job_id", "bytes",
        "created_unix_ms", "metadata"}``."""
        return self._c.list()

    def restore(self, state: State, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """Loads the newest valid checkpoint (or ``step``) into ``state`` and
        returns its info (as ``list()``) plus ``"skipped"``: why newer
        checkpoints were not used (a corrupt shard, naming the file and key).
        Each tensor is verified as it is read; when one fails its checksum,
        every object is loaded again from the previous valid checkpoint.

        Returns ``None`` when ``dir`` holds no checkpoint at all. When it holds
        step directories but none is a valid checkpoint, raises
        ``RuntimeError`` naming each and why (a job must not silently start
        over from step 0), unless opened with ``start_fresh=True``, which
        returns ``None`` then. Raises ``FileNotFoundError`` when ``step``
        does not exist; ``RuntimeError`` naming the file and key
        when a corrupt checkpoint was partly loaded and no older one could
        replace it (the state is then unspecified).

        With ``config``: ``ValueError`` naming the fields that differ, before
        anything is loaded."""
        if self._config is not None:
            infos = self._c.list()
            chosen = [i for i in infos if step is None or i["step"] == step][:1]
            for info in chosen:
                self.check_config(info)
        return self._c.restore(_registry(state), step)

    def close(self) -> None:
        """Waits for a pending save (raising its error), then releases the
        directory lock. Idempotent; also done at interpreter exit."""
        self._c.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    @property
    def dir(self) -> str:
        return self._c.dir

    @property
    def native(self) -> _C.CheckpointManager:
        return self._c

    _closing_what = "checkpoint manager"

    def __repr__(self) -> str:
        return f"<omni.CheckpointManager {self.dir!r}{' closed' if self.closed else ''}>"


def _save_cost(checkpoint: Any, state_bytes: int):
    """(mean, stddev) seconds of the next save; see PreemptionMonitor.decide."""
    times = list(getattr(checkpoint, "save_times_s", []) or [])
    if times:
        mean = sum(times) / len(times)
        var = sum((t - mean) ** 2 for t in times) / len(times)
        return mean, var ** 0.5
    size = state_bytes or getattr(checkpoint, "last_save_bytes", 0)
    if not size and checkpoint is not None:
        infos = checkpoint.list()
        size = infos[0]["bytes"] if infos else 0
    if not size:
        return 1.0, 0.5
    mean = 0.05 + size / 100e6
    return mean, 0.5 * mean


class BoundaryDecision(NamedTuple):
    """What to do at a step boundary."""

    action: str  # "continue", "save_and_exit" or "exit_without_save"
    reason: str  # for the log; "" when nothing is pending
    deadline_ns: int  # on the monitor's clock (now_ns()); 0 when nothing is pending


class PreemptionMonitor(_ClosingContext):
    """Turns preemption signals, a scheduler's notice file and ``notice()``
    calls into a decision at every step boundary.

    ``signals``: the signals that request preemption (default SIGTERM,
    SIGUSR1, SIGINT; a second one escalates: save at the next boundary).
    ``notice_file``: a JSON file ``{"deadline_unix_ms": T}`` or
    ``{"yield_in_s": S}`` polled every ``notice_poll_s``. ``grace_s``: the
    deadline after a signal; with ``apply_environment`` the variable
    ``OMNI_PREEMPT_GRACE_S`` overrides it. Costs are taken as mean + k·stddev.
    ``clock``: an ``omni.FakeClock`` for tests. ``notice_store`` /
    ``notice_key``: an ``omni.Store`` key polled like the notice file (a job
    scheduler, or one replica for all, writes the notice there).
    All options are keyword-only.

    Signals: creating the monitor installs C-level handlers for ``signals``
    that replace Python's own while it lives: for those signals no Python
    handler runs (SIGINT no longer raises ``KeyboardInterrupt``; it requests
    preemption instead), and a handler installed with ``signal.signal`` in the
    meantime would take the signal away from the monitor. ``close()`` (or
    leaving the ``with`` block, or interpreter exit) restores the previous
    handlers. Only one monitor may exist per process (``RuntimeError``).
    """

    def __init__(
        self,
        *,
        signals: Optional[Iterable[int]] = None,
        notice_file: Optional[_Path] = None,
        grace_s: float = 30.0,
        k: float = 2.0,
        apply_environment: bool = True,
        notice_poll_s: float = 0.1,
        clock: Optional[_C.FakeClock] = None,
        notice_store: Optional[_C.Store] = None,
        notice_key: str = "",
    ) -> None:
        sigs = None if signals is None else [int(s) for s in signals]
        store_options: Dict[str, Any] = {}
        if notice_store is not None:
            store_options = {"notice_store": notice_store, "notice_key": notice_key}
        if notice_file is not None and os.fspath(notice_file) == "":
            notice_file = None
        self._c = _C.PreemptionMonitor(
            signals=sigs, notice_file=notice_file, grace_s=grace_s, k=k,
            apply_environment=apply_environment, notice_poll_s=notice_poll_s, clock=clock,
            **store_options,
        )

    def at_boundary(
        self,
        next_step_mean_s: float,
        next_step_stddev_s: float = 0.0,
        save_mean_s: float = 0.0,
        save_stddev_s: float = 0.0,
    ) -> BoundaryDecision:
        """Call between steps with the expected cost of the next step and of a
        save: ``continue`` when nothing is pending or one more step and a save
        still fit before the deadline; ``save_and_exit`` when only the save
        fits (save, then exit with ``EXIT_PREEMPTED``); ``exit_without_save``
        when not even the save fits (exit with ``EXIT_PREEMPTED_NO_SAVE``)."""
        return BoundaryDecision(
            *self._c.at_boundary(next_step_mean_s, next_step_stddev_s, save_mean_s, save_stddev_s)
        )

    def decide(self, telemetry: Any = None, checkpoint: Any = None, *,
               state_bytes: int = 0) -> BoundaryDecision:
        """``at_boundary`` with the costs taken from the runtime instead of
        the caller: the next step costs the longest step ``telemetry`` (an
        ``omni.Telemetry``) has seen, warm-up included; a save costs the
        mean and standard deviation of ``checkpoint``'s synchronous saves
        (an ``omni.CheckpointManager``), or before the first one 0.05 s plus
        ``state_bytes`` (else the newest checkpoint's size) at a conservative
        100 MB/s, with a 50% standard deviation (1 s when nothing is known).
        """
        step_s = 0.0
        if telemetry is not None:
            step_s = telemetry.worst_step_s
            for row in telemetry.snapshot().get("rows", []):
                if row["name"] == "step":
                    step_s = max(step_s, row["max_ms"] / 1e3)
        save_mean, save_std = _save_cost(checkpoint, state_bytes)
        return self.at_boundary(step_s, 0.0, save_mean, save_std)

    def notice(self, deadline_ns: int) -> None:
        """A scheduler's notice: leave by ``deadline_ns`` (see ``now_ns()``)."""
        self._c.notice(deadline_ns)

    def now_ns(self) -> int:
        """The monitor's clock, in nanoseconds."""
        return self._c.now_ns()

    @property
    def pending(self) -> bool:
        """True once a signal or a notice has arrived (stays true)."""
        return self._c.pending

    @property
    def signals_received(self) -> int:
        return self._c.signals_received

    @property
    def last_notice_error(self) -> Optional[str]:
        """The last problem with the notice file (the notice was ignored)."""
        return self._c.last_notice_error

    @property
    def grace_s(self) -> float:
        """The grace period in effect (after ``OMNI_PREEMPT_GRACE_S``)."""
        return self._c.grace_s

    def close(self) -> None:
        """Restores the previous signal handlers. Idempotent."""
        self._c.close()

    @property
    def closed(self) -> bool:
        return self._c.closed

    _closing_what = "preemption monitor"

    def __repr__(self) -> str:
        return f"<omni.PreemptionMonitor pending={self.pending if not self.closed else 'closed'}>"
