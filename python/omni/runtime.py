"""omni.Runtime: the one door, as in C++ (omni::Runtime, docs/runtime.md).

A Runtime owns the telemetry, the preemption monitor, the checkpoint
directory, the rendezvous store, the elastic group, the job-wide stop
agreement and the data sampler, and makes one decision per step boundary.
The boundary's state machine is the C++ one (omni._C binds omni::Runtime):

    import omni

    ts = omni.TrainState(model=model, optimizer=opt, scheduler=sched)
    with omni.Runtime(ckpt_dir="ckpt", ckpt_every=100, step_log="steps.jsonl",
                      dataset_size=len(data), global_batch=64, job_id="lm") as rt:
        rt.register(ts)                        # model, optim, sched, RNGs, progress
        for step in rt.steps(total=5000):      # restores, joins; SIGTERM -> SystemExit(75)
            with rt.phase(omni.COMPUTE):
                loss = model(data[rt.local_batch()]); opt.zero_grad(); loss.backward()
            if rt.allreduce_gradients(model.parameters(), average=True):
                opt.step(); sched.step()       # else the step is redone

Options are keywords; their defaults come from the environment the way
``RuntimeOptions::FromEnvironment`` reads it (``environment=False`` ignores
it): RANK / WORLD_SIZE / LOCAL_RANK (torchrun) or SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID; OMNI_STORE, else tcp://MASTER_ADDR:MASTER_PORT
(torchrun's store: the job is elastic); OMNI_REPLICA_ID (else rank-<RANK>),
OMNI_MIN_REPLICAS / OMNI_MAX_REPLICAS (else WORLD_SIZE), OMNI_CKPT_DIR,
OMNI_CKPT_EVERY, OMNI_CKPT_EVERY_S, OMNI_STEP_LOG, OMNI_TRACE, OMNI_NOTICE_FILE,
OMNI_NOTICE_KEY, OMNI_PREEMPT_GRACE_S, OMNI_RACK, OMNI_SWITCH, OMNI_JOB_ID.
Keywords given explicitly win.

Keywords (``omni.Runtime`` documents each):

- identity: ``source``, ``job_id``, ``total_steps``, ``rank``,
  ``world_size``, ``local_rank``;
- telemetry: ``step_log``, ``trace``, ``forecast_file``, and
  ``telemetry={...}`` with any ``omni.Telemetry`` option;
- checkpoints: ``ckpt_dir``, ``ckpt_every`` (steps) or ``ckpt_every_s`` (wall
  time: at the first step boundary that many seconds after the last save's,
  as Lightning's ``train_time_interval``; elastic replicas agree on the
  boundary), ``keep_last``, ``async_ckpt``, ``start_fresh``, ``metadata``
  (dict of str);
- preemption: ``handle_preemption`` (default True: SIGTERM/SIGUSR1 are
  handled; one per process), ``grace_s``, ``notice_file``, ``notice_key``
  (a key of the store), ``preemption={...}`` (``omni.PreemptionMonitor``'s
  options);
- elastic data parallelism (on when there is a store): ``store`` (a URI, an
  ``omni.Store``, or None for none whatever the environment says),
  ``replica_id``, ``min_replicas``, ``max_replicas``, ``model_digest``,
  ``leave_on_preempt``, ``elastic={...}`` (``omni.ElasticGroup``'s options);
- data: ``dataset_size`` (0: no sampler), ``global_batch``, ``seed``,
  ``shuffle``, ``drop_last`` (or ``sampler={...}``);
- ``clock`` (an ``omni.FakeClock``), ``log`` (a callable receiving each
  event line; default: stderr).

State keys the Runtime writes itself: ``runtime/step`` (committed steps)
and, with a sampler, ``data/...`` (its cursor). ``register(train_state)``
adds TrainState's keys (``omni.train``): ``model``, ``optim``, ``sched``,
``progress`` (replicated) and ``rng/python``, ``rng/numpy``, ``rng/torch``,
``carry`` (per replica).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional

from . import _C
from ._util import ClosingContext as _ClosingContext
from .elastic import as_buffer
from .train import TrainState

__all__ = ["Runtime", "Decision"]


@dataclass(frozen=True)
class Decision:
    """What to do after a step boundary (``Runtime.end_step``).

    ``kind``: ``"continue"``; ``"reconfigured"`` (the group changed: new
    ``rank`` / ``size``, the state is already re-synchronised);
    ``"redo"`` (a collective of the step failed: nothing of it was
    committed; run step ``Runtime.step`` again); ``"save_and_exit"``
    (preempted: the save, if one fit, is done; exit with ``exit_code``,
    75 = resumable, 76 = no save fit before the deadline). ``saved_step``
    is the step saved (-1 when none); ``reason`` is for the log.
    """

    kind: str
    rank: int
    size: int
    exit_code: int
    saved_step: int
    reason: str


class _Progress:
    """TrainState's ``progress`` values under a Runtime: the saved ``step``
    is the Runtime's committed step."""

    def __init__(self, progress: Any, runtime: "Runtime") -> None:
        self._progress = progress
        self._runtime = runtime

    def save(self, writer) -> None:
        self._progress["step"] = self._runtime.step
        self._progress.save(writer)

    def load(self, reader) -> None:
        self._progress.load(reader)


class Runtime(_ClosingContext):
    """The one door (see the module docstring for the keywords).

    The loop, explicitly: ``start()`` (restores the newest checkpoint, joins
    the group; returns the first step), then per step ``begin_step()``, the
    work, ``allreduce``/``allreduce_gradients`` (False: the step is lost,
    skip the optimizer), and ``end_step()`` -> :class:`Decision`; at the
    end ``finish()``. ``steps(total)`` does all of that as a generator.

    Errors: a bad option raises ``ValueError`` / ``TypeError`` naming it; a
    checkpoint directory in use, a store that cannot be opened, a restore or
    join that fails raise with the core's message; an exception a state
    object raised in ``save`` / ``load`` is re-raised as it is.

    ``close()`` (or leaving the ``with``) without ``finish()`` drops the
    runtime: the heartbeats stop, so the other replicas see this one die.
    Use from the training thread.
    """

    _closing_what = "runtime"

    def __init__(self, *, environment: bool = True, **options: Any) -> None:
        self._c = _C.Runtime(environment=environment, **options)
        self._telemetry = None
        self._train_states: List[TrainState] = []
        self.decision: Optional[Decision] = None
        """The last boundary's decision."""

    # ---- state

    def register(self, name: Any, obj: Any = None, *, scope: str = "replicated") -> Any:
        """Registers state before ``start()``: ``register("model", obj)``
        with ``obj`` having ``save(writer)`` / ``load(reader)`` (or an
        ``omni.DistributedSampler``), ``scope`` "replicated" (identical on
        every replica; what the elastic group synchronises) or
        "per_replica"; or ``register(train_state)`` for every key of an
        ``omni.TrainState`` (its ``step`` then reads the Runtime's).
        Returns ``obj`` (or the TrainState)."""
        if isinstance(name, TrainState):
            ts = name
            for key, o in ts._replicated:
                self._c.register(key, _Progress(o, self) if o is ts.progress else o, "replicated")
            for key, o in ts._per_replica:
                self._c.register(key, o, "per_replica")
            ts._runtime = self
            self._train_states.append(ts)
            return ts
        if obj is None:
            raise TypeError("register(name, obj): obj is missing")
        self._c.register(name, obj, scope)
        return obj

    # ---- the loop

    def start(self) -> int:
        """Restores the newest valid checkpoint, joins the elastic group (a
        replica behind the others receives their state) and returns the
        first step to run."""
        return self._c.start()

    def begin_step(self) -> None:
        """Opens step ``step`` in the telemetry."""
        self._c.begin_step()

    def allreduce(self, buffer: Any, op: str = "sum") -> bool:
        """Reduces ``buffer`` (numpy array, CPU tensor, buffer protocol) in
        place over the replicas (nothing without a group). False when the
        collective failed: the step is lost (skip the optimizer);
        ``end_step`` recovers and answers "redo"."""
        return self._c.allreduce(as_buffer(buffer), op)

    def allreduce_gradients(self, parameters: Iterable[Any], *, average: bool = False) -> bool:
        """Sums (``average``: averages) the gradients of torch
        ``parameters`` over the replicas, one collective per dtype. A
        missing gradient counts as zeros. True without a group. False when
        a collective failed (see ``allreduce``)."""
        if not self.elastic:
            return True
        import torch

        by_dtype: dict = {}
        for p in parameters:
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.detach().reshape(-1).cpu() for g in grads])
            if not self._c.allreduce(flat.numpy(), "sum"):
                return False
            if average:
                flat /= self.size
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n
        return True

    def end_step(self) -> Decision:
        """The boundary: commit, periodic checkpoint, a new generation,
        recovery after a failed collective, preemption (costs from the
        telemetry). Returns the :class:`Decision`."""
        self.decision = Decision(**self._c.end_step())
        return self.decision

    def yield_now(self, reason: str = "yielded") -> Decision:
        """Between steps, when no further step will start now (a guest
        whose host has no window for it, or has finished): give the devices
        back at once. A pending preemption: save if the save still fits
        before its deadline (exit code 75), else exit without one (76);
        nothing pending: save and exit 75 with ``reason``. RuntimeError
        before ``start``, while a step is open, or in elastic mode."""
        self.decision = Decision(**self._c.yield_now(reason))
        return self.decision

    def steps(self, total: int, *, exit: bool = True) -> Iterator[int]:
        """The loop as a generator: starts (unless started), then yields
        each step to run, between ``begin_step`` and ``end_step``; a
        "redo" yields the same step again. On "save_and_exit" it calls
        ``finish()`` and raises ``SystemExit(exit_code)`` (``exit=False``:
        returns instead; ``decision`` says why). After step ``total`` it
        calls ``finish()``."""
        if not self.started:
            self.start()
        while self.step < total:
            self.begin_step()
            yield self.step
            d = self.end_step()
            if d.kind == "save_and_exit":
                self.finish()
                if exit:
                    raise SystemExit(d.exit_code)
                return
        self.finish()

    def local_batch(self) -> List[int]:
        """This replica's indices of the next global batch (the sampler's
        committed cursor, this rank of the current size). RuntimeError
        without ``dataset_size``."""
        return self._c.local_batch()

    def finish(self) -> None:
        """After the last step (or a save_and_exit): waits for a pending
        checkpoint, tells replicas waiting to join that the job is over,
        closes the telemetry. Idempotent."""
        self._c.finish()

    # ---- telemetry

    @property
    def telemetry(self):
        """The Runtime's ``omni.Telemetry`` (phases, snapshot, forecasts,
        sinks); closed by the Runtime."""
        if self._telemetry is None:
            from . import Telemetry

            self._telemetry = Telemetry._of(self._c.telemetry)
        return self._telemetry

    def phase(self, phase: Any):
        """``with rt.phase(omni.COMPUTE): ...``: a phase of the open step."""
        return self.telemetry.phase(phase)

    # ---- any thread

    @property
    def step(self) -> int:
        """Steps committed: the next step to run."""
        return self._c.step

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def elastic(self) -> bool:
        """Whether this runtime has an elastic group (after ``start``)."""
        return self._c.elastic

    @property
    def generation(self) -> Optional[dict]:
        """``{"number", "kind", "rank", "size", "description"}`` of the
        group's current generation, or None without a group."""
        return self._c.generation

    @property
    def sampler(self):
        """The ``omni.DistributedSampler`` (None without ``dataset_size``)."""
        return self._c.sampler

    @property
    def last_save_s(self) -> float:
        return self._c.last_save_s

    @property
    def preemption_pending(self) -> bool:
        return self._c.preemption_pending

    @property
    def started(self) -> bool:
        return self._c.started

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        """Drops the runtime (see the class docstring); a registered
        TrainState keeps the last committed step as its own."""
        if not self._c.closed:
            for ts in self._train_states:
                ts._runtime = None
                ts.step = self._c.step
        self._c.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<omni.Runtime closed>"
        return f"<omni.Runtime step={self.step} rank={self.rank}/{self.size}>"

