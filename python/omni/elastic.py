"""Elastic data parallelism from Python: a rendezvous store, a communicator
on buffers, and the elastic group of replicas (over include/omni/store.h,
comm.h and elastic.h).

    import numpy as np, omni

    store = omni.open_store("file:///shared/job-42/store")
    state = omni.StateRegistry()                       # replicated: identical on every replica
    state.register("model", omni.state.ArrayState(weights))
    state.register("progress", progress)               # e.g. JsonState({"step": 0})

    with omni.ElasticGroup(store, state, job_id="job-42", replica_id="r0",
                           min_replicas=1, max_replicas=4) as group:
        group.start(completed=progress["step"])        # join; state synchronised
        step = progress["step"]
        while step < steps:
            group.at_boundary(step)                    # admits joiners, may resync state
            grads = local_gradients(...)
            try:
                group.allreduce(grads, op="avg")       # in place, GIL released
            except (ConnectionError, TimeoutError, RuntimeError):
                group.recover(step)                    # survivors agree; redo the step
                continue
            apply(grads); step += 1; progress["step"] = step
        group.finish()

Buffers: collectives work in place on numpy arrays and anything with the
buffer protocol (C-contiguous, writable; float32, float64, int32, int64,
uint8), and on torch CPU tensors (through ``tensor.numpy()``, which shares
memory). CUDA tensors are refused: the Gloo backend works in host memory.

Stores: ``file:///abs/dir`` (a directory shared by the processes, on one host
or a shared file system); ``tcp://host:port`` and ``env://`` (torchrun's
store, a c10d TCPStore), through c10d's C++ client where this build has
LibTorch and the process's torch is that LibTorch, else through the user's
``torch.distributed.TCPStore`` (``omni._torch_store`` says which and why); or
a ``torch.distributed.Store`` object.

Errors: a bad status raises ``ValueError`` (invalid argument, naming it),
``TimeoutError`` (a wait or collective past its timeout, naming the keys or
the ranks), ``ConnectionError`` (a peer's connection was lost),
``FileNotFoundError`` or ``RuntimeError`` (anything else), with the core's
message.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import _C
from ._C import Store, default_comm_options, default_elastic_options
from ._util import ClosingContext as _ClosingContext

__all__ = [
    "Store",
    "open_store",
    "Communicator",
    "ElasticGroup",
    "as_buffer",
    "default_comm_options",
    "default_elastic_options",
]


def open_store(uri: Any) -> Store:
    """Opens a rendezvous store.

    ``uri`` is ``"file:///abs/dir"`` (a directory the processes share),
    ``"tcp://host:port[?server=1&timeout=60s]"`` or ``"env://"`` (a
    ``torch.distributed.TCPStore`` of the user's torch: torchrun's agent
    store at MASTER_ADDR / MASTER_PORT, or one this process serves),
    ``"etcd://host:port"``; or a ``torch.distributed.Store`` object itself
    (e.g. the one torch's process group uses), used as it is. A job secret
    (OMNI_JOB_SECRET / OMNI_JOB_SECRET_FILE / ``?secret_file=``)
    authenticates every record of a URI's store; a store on another host
    without one is refused unless the URI has ``insecure=1``.
    """
    if isinstance(uri, str):
        return _C.open_store(uri)
    if all(hasattr(uri, m) for m in ("set", "add", "compare_set", "delete_key")):
        from ._torch_store import TorchStore

        label = f"torch {type(uri).__name__}"
        return _C.wrap_python_store(TorchStore(uri, label), label)
    raise TypeError(f"open_store: expected a URI or a torch.distributed.Store, got "
                    f"{type(uri).__name__}")


def as_buffer(x: Any) -> Any:
    """``x`` as an object with the buffer protocol, sharing its memory: a
    torch CPU tensor becomes ``x.numpy()`` (``ValueError`` for a CUDA or a
    non-contiguous tensor, whose memory cannot be shared); anything else is
    returned as it is."""
    module = type(x).__module__
    if module.startswith("torch") and hasattr(x, "numpy"):
        if x.device.type != "cpu":
            raise ValueError(
                f"a {x.device.type} tensor cannot be used in place by the gloo backend; "
                "copy it to the CPU (and back) around the collective"
            )
        if not x.is_contiguous():
            raise ValueError("a non-contiguous tensor cannot be reduced in place; use .contiguous()")
        return x.detach().numpy()
    return x


class Communicator(_ClosingContext):
    """The ranks of one collective group, found through ``store`` (give every
    communicator a store prefix of its own: ``store.prefix("comm/1")``).

    Keyword options: ``rank``, ``size``, ``backend`` ("gloo"), ``host`` (the
    address to listen on), ``device`` (NCCL), ``init_timeout_s`` (every rank
    must arrive within it) and ``timeout_s`` (each collective's default).

    A failed collective (a peer died or is too slow) breaks the communicator
    for good: every later call raises the same error; build a new one.
    Collectives must be called in the same order on every rank, from one
    thread at a time; ``abort()`` may be called from any thread.
    """

    _closing_what = "communicator"

    def __init__(self, store: Store, **options: Any) -> None:
        self._c = _C.Communicator(store, **options)

    def allreduce(self, buffer: Any, op: str = "sum", timeout_s: Optional[float] = None) -> Any:
        """Reduces ``buffer`` in place over every rank (``op``: sum, avg,
        min, max; avg of integers truncates) and returns it."""
        self._c.allreduce(as_buffer(buffer), op, timeout_s)
        return buffer

    def broadcast(self, buffer: Any, root: int = 0, timeout_s: Optional[float] = None) -> Any:
        """Copies rank ``root``'s ``buffer`` into every rank's, in place."""
        self._c.broadcast(as_buffer(buffer), root, timeout_s)
        return buffer

    def allgather(self, input: Any, output: Any, timeout_s: Optional[float] = None) -> Any:
        """Rank r's ``input`` lands at ``output[r]`` (``output`` holds
        ``size`` times the bytes of ``input``) on every rank."""
        self._c.allgather(as_buffer(input), as_buffer(output), timeout_s)
        return output

    def barrier(self, timeout_s: Optional[float] = None) -> None:
        self._c.barrier(timeout_s)

    def abort(self) -> None:
        """Breaks the communicator: a collective waiting in another thread
        returns promptly with an error. Idempotent."""
        self._c.abort()

    @property
    def async_error(self) -> Optional[str]:
        """``None`` while healthy, else the error that broke it."""
        return self._c.async_error

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    def close(self) -> None:
        self._c.close()


class ElasticGroup(_ClosingContext):
    """Data-parallel replicas that survive the loss of replicas and admit new
    ones at step boundaries (omni::ElasticGroup).

    ``state`` (an ``omni.StateRegistry``) is the *replicated* state, identical
    on every replica: model, optimizer, LR schedule, data cursor, step
    counter. After a change of generation the replica with the most completed
    steps broadcasts it, and the others verify it (XXH3) and load it. Keep
    per-replica state (RNGs) in another registry.

    Keyword options (``omni.default_elastic_options()`` lists the defaults):
    ``job_id`` and ``model_digest`` (a replica with others is refused),
    ``replica_id`` (unique, [A-Za-z0-9_.-]), ``replica_host``, ``rack``,
    ``switch`` (placement), ``min_replicas``, ``max_replicas``,
    ``heartbeat_s``, ``peer_timeout_s`` (a silent replica is dead after it),
    ``join_timeout_s``, ``settle_s``, ``store_retry_s``, ``backend``
    ("gloo"), ``host`` (address to listen on), ``device``,
    ``collective_timeout_s``, ``init_timeout_s``.

    The loop: ``start(completed)``, then per step ``at_boundary(completed)``
    (returns a change dict, or ``None``), the collectives, and on a failed
    collective ``recover(completed)`` and redo the step (nothing of it may be
    committed). The step counter must be read back from ``state`` after
    ``start`` / ``at_boundary`` / ``recover`` returned a change: it may have
    been replaced by a more advanced replica's. ``close()`` (or leaving the
    ``with``) stops the heartbeats: the others then see this replica as
    dead. ``leave(completed)`` leaves gracefully instead; ``finish()`` marks
    the job done (replicas still waiting to join are told so).

    Use from one thread; every blocking call releases the GIL.
    """

    _closing_what = "elastic group"

    def __init__(self, store: Store, state: Any, **options: Any) -> None:
        self._c = _C.ElasticGroup(store, state, **options)

    def start(self, completed: int = 0) -> Dict[str, Any]:
        """Joins (waits until admitted), builds the communicator and
        synchronises the state. Returns the change: ``{"generation": {...},
        "source_rank", "state_received", "state_bytes", "completed",
        "agree_ms", "build_ms", "sync_ms"}``."""
        return self._c.start(completed)

    def at_boundary(self, completed: int) -> Optional[Dict[str, Any]]:
        """At every step boundary; a change when a new generation takes
        effect here (a joiner admitted, a graceful leave), else ``None``. A
        change whose generation has ``rank`` -1 means this replica left."""
        return self._c.at_boundary(completed)

    def recover(self, completed: int) -> Dict[str, Any]:
        """After a failed collective: agrees on the survivors, rebuilds the
        communicator and synchronises the state; then redo the step."""
        return self._c.recover(completed)

    def leave(self, completed: int) -> None:
        """Leaves gracefully at the boundary after ``completed`` + 1 steps."""
        self._c.leave(completed)

    def finish(self) -> None:
        """Marks the job finished (idempotent)."""
        self._c.finish()

    def allreduce(self, buffer: Any, op: str = "sum", timeout_s: Optional[float] = None) -> Any:
        """In place over the current generation; see ``Communicator``. A
        failure is remembered for ``recover``."""
        self._c.allreduce(as_buffer(buffer), op, timeout_s)
        return buffer

    def broadcast(self, buffer: Any, root: int = 0, timeout_s: Optional[float] = None) -> Any:
        self._c.broadcast(as_buffer(buffer), root, timeout_s)
        return buffer

    def allgather(self, input: Any, output: Any, timeout_s: Optional[float] = None) -> Any:
        self._c.allgather(as_buffer(input), as_buffer(output), timeout_s)
        return output

    def barrier(self, timeout_s: Optional[float] = None) -> None:
        self._c.barrier(timeout_s)

    @property
    def generation(self) -> Dict[str, Any]:
        """``{"number", "kind", "at_step", "members", "joined", "left",
        "rank", "size", "description"}``."""
        return self._c.generation

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def dead_peers(self):
        return self._c.dead_peers

    @property
    def heartbeat_error(self) -> Optional[str]:
        return self._c.heartbeat_error

    @property
    def closed(self) -> bool:
        return self._c.closed

    def close(self) -> None:
        self._c.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<omni.ElasticGroup closed>"
        return f"<omni.ElasticGroup {self.generation['description']}>"
