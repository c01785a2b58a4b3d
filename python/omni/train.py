"""Torch glue: the whole training state of a PyTorch loop in one object, and
a resumable sampler for torch's DataLoader. Pure Python; torch is imported
only when a torch object is saved or loaded, so ``import omni`` works
without it.

    import omni

    sampler = omni.ResumableBatchSampler(len(dataset), global_batch=32, seed=1)
    loader = sampler.data_loader(dataset, num_workers=2)   # prefetching workers
    ts = omni.TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                         carry={"hidden": None})
    with omni.CheckpointManager("ckpt", keep_last=3) as ckpt:
        ts.restore(ckpt)                       # no-op on the first run
        for batch in loader:                   # resumes at the committed cursor
            loss = step(model, batch, ts.carry["hidden"])
            opt.step(); sched.step()
            sampler.commit(); ts.step += 1     # the batch is consumed
            if ts.step % 100 == 0:
                ckpt.save_async(ts.step, ts.registry())

State keys (each the name of a state object; docs/python.md lists the keys
inside each):

    model                 TorchModuleState (model/<name> for several modules)
    optim                 TorchOptimizerState (optim/<i> for several)
    sched                 TorchSchedulerState (sched/<i> for several)
    data                  the sampler's cursor (DistributedSampler)
    progress              JsonState {"step": ..., plus extra values}
    carry                 TorchTensorsState (tensors kept between batches)
    rng/python            PythonRandomState
    rng/numpy             NumpyRandomState
    rng/torch             TorchRngState (cpu, cuda/<i> for every CUDA device)

``replicated()`` is the part every data-parallel replica holds identically
(model, optim, sched, data, progress) for ``omni.ElasticGroup``;
``per_replica()`` the rest (RNGs, carry).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ._C import DistributedSampler, StateRegistry
from .state import (
    JsonState,
    NumpyRandomState,
    PythonRandomState,
    TorchModuleState,
    TorchOptimizerState,
    TorchRngState,
    TorchSchedulerState,
    TorchTensorsState,
)

__all__ = ["TrainState", "ResumableBatchSampler", "params_xxh3"]


def params_xxh3(module: Any) -> str:
    """XXH3-64 of a torch module's parameters (``named_parameters()`` order,
    raw bytes on the CPU) as 16 hex digits: the ``params_xxh3`` that
    omni_train and the examples print, to compare runs bit for bit."""
    import torch

    from ._C import xxh3_hex

    return xxh3_hex([p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                     for _, p in module.named_parameters()])


def _named(prefix: str, value: Any) -> List[tuple]:
    """(key, object) pairs for one object, a sequence or a mapping of them."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [(f"{prefix}/{name}", v) for name, v in value.items()]
    if isinstance(value, (list, tuple)):
        if len(value) == 1:
            return [(prefix, value[0])]
        return [(f"{prefix}/{i}", v) for i, v in enumerate(value)]
    return [(prefix, value)]


class ResumableBatchSampler:
    """A ``batch_sampler`` for ``torch.utils.data.DataLoader`` over
    ``omni.DistributedSampler``: every iteration yields this replica's
    indices of the global batches of one epoch, starting at the *committed*
    cursor, in a deterministic order (seed, epoch).

    Workers prefetch: a DataLoader with ``num_workers`` > 0 draws up to
    ``num_workers * prefetch_factor`` batches ahead of the training loop.
    The sampler therefore never counts what it hands out; the loop calls
    ``commit()`` once per batch it has consumed (after the optimizer step),
    and only committed batches are in a checkpoint. After a restore, the
    prefetched-but-unconsumed batches are served again, and every sample is
    consumed exactly once per epoch.

    Keyword options: ``global_batch`` (all replicas together), ``seed``,
    ``shuffle``, ``drop_last`` (as ``DistributedSampler``), ``replica`` and
    ``num_replicas`` (this replica's slice; ``set_replicas`` changes them,
    e.g. after an elastic change: build a new DataLoader iterator then).
    It is a state object itself (key ``cursor``).

    Build the DataLoader with ``data_loader(dataset, ...)``, or pass it a
    ``generator=torch.Generator()`` of its own: a DataLoader draws its
    workers' base seed from torch's global generator every time an iterator
    is made, which would shift the restored RNG stream of a resumed run.
    """

    def __init__(self, dataset_size: int, *, global_batch: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True, replica: int = 0,
                 num_replicas: int = 1) -> None:
        self.sampler = DistributedSampler(dataset_size, global_batch=global_batch, seed=seed,
                                          shuffle=shuffle, drop_last=drop_last)
        self.set_replicas(replica, num_replicas)

    def set_replicas(self, replica: int, num_replicas: int) -> None:
        if not 0 <= replica < num_replicas:
            raise ValueError(f"replica must be in [0, {num_replicas}), got {replica}")
        self.replica = replica
        self.num_replicas = num_replicas

    def __iter__(self) -> Iterator[List[int]]:
        """This replica's batches from the committed cursor to the end of
        its epoch (one DataLoader epoch). With ``drop_last=False`` a replica
        may get an empty list in the short last batch."""
        cursor = self.sampler.cursor
        while True:
            yield self.sampler.batch_at(*cursor, replica=self.replica,
                                        num_replicas=self.num_replicas)
            nxt = self.sampler.next_cursor(*cursor)
            if nxt[1] == 0:
                return  # that was the last batch of its epoch
            cursor = nxt

    def __len__(self) -> int:
        """Global batches left in the committed cursor's epoch."""
        epoch, offset = self.sampler.cursor
        done = offset // self.sampler.options["global_batch"]
        return max(0, self.sampler.batches_per_epoch - done)

    def data_loader(self, dataset: Any, **options: Any) -> Any:
        """``torch.utils.data.DataLoader(dataset, batch_sampler=self,
        generator=<a generator of its own>, **options)``: its worker seeds do
        not draw from torch's global generator, so a resumed run's RNG
        stream is the uninterrupted run's. Worker seeds follow the
        loader's own generator (seed it via ``generator=`` to control them)."""
        import torch

        options.setdefault("generator", torch.Generator().manual_seed(self.sampler.options["seed"]))
        return torch.utils.data.DataLoader(dataset, batch_sampler=self, **options)

    def commit(self) -> None:
        """Marks the global batch at the cursor as consumed."""
        self.sampler.commit()

    @property
    def cursor(self):
        """(epoch, samples of the epoch consumed by all replicas)."""
        return self.sampler.cursor

    @property
    def epoch(self) -> int:
        return self.sampler.cursor[0]

    def save(self, writer) -> None:
        self.sampler.save(writer)

    def load(self, reader) -> None:
        self.sampler.load(reader)


class TrainState:
    """The state of a PyTorch training loop, registered under fixed keys
    (see the module docstring), for ``omni.CheckpointManager`` and
    ``omni.ElasticGroup``.

    ``model``, ``optimizer``, ``scheduler``: one object, a sequence or a
    mapping of them. ``sampler``: an ``omni.ResumableBatchSampler`` or
    ``omni.DistributedSampler``. ``carry``: a dict of tensors carried between
    batches (an RNN's hidden state), replaced on restore. ``rng``: save the
    RNGs of ``random``, numpy, torch CPU and every CUDA device (default
    True). ``extra``: more state objects ``{key: obj}``. ``step`` and
    ``values`` (a dict in the ``progress`` object) are the loop position.
    """

    def __init__(self, *, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 sampler: Any = None, carry: Optional[Dict[str, Any]] = None, rng: bool = True,
                 extra: Optional[Mapping[str, Any]] = None, step: int = 0,
                 values: Optional[Dict[str, Any]] = None) -> None:
        self.progress = JsonState({"step": int(step), **(values or {})})
        self._carry = TorchTensorsState(carry) if carry is not None else None
        self._replicated: List[tuple] = []
        self._replicated += [(k, TorchModuleState(m)) for k, m in _named("model", model)]
        self._replicated += [(k, TorchOptimizerState(o)) for k, o in _named("optim", optimizer)]
        self._replicated += [(k, TorchSchedulerState(s)) for k, s in _named("sched", scheduler)]
        if sampler is not None:
            self._replicated.append(("data", sampler))
        self._replicated.append(("progress", self.progress))
        self._per_replica: List[tuple] = []
        if self._carry is not None:
            self._per_replica.append(("carry", self._carry))
        if rng:
            self._per_replica += [("rng/python", PythonRandomState()),
                                  ("rng/numpy", NumpyRandomState())]
            if _torch_available():
                self._per_replica.append(("rng/torch", TorchRngState()))
        for key, obj in (extra or {}).items():
            self._per_replica.append((key, obj))
        self._registries: Dict[str, StateRegistry] = {}
        self._runtime: Any = None  # set by omni.Runtime.register(self)

    # ---- the loop position

    @property
    def step(self) -> int:
        """The loop position; under an ``omni.Runtime`` (``rt.register(ts)``)
        the Runtime's committed steps."""
        if self._runtime is not None:
            return self._runtime.step
        return int(self.progress["step"])

    @step.setter
    def step(self, value: int) -> None:
        if self._runtime is not None:
            raise AttributeError("this TrainState is registered with an omni.Runtime, which "
                                 "counts the steps (at end_step)")
        self.progress["step"] = int(value)

    @property
    def values(self) -> Dict[str, Any]:
        """The progress dict (``step`` and any JSON values of the loop)."""
        return self.progress.values

    @property
    def carry(self) -> Dict[str, Any]:
        """The tensors carried between batches (replaced by a restore)."""
        if self._carry is None:
            raise AttributeError("this TrainState has no carry (pass carry={...})")
        return self._carry.tensors

    # ---- registries

    def _registry(self, kind: str, entries: Sequence[tuple]) -> StateRegistry:
        if kind not in self._registries:
            registry = StateRegistry()
            for key, obj in entries:
                registry.register(key, obj)
            self._registries[kind] = registry
        return self._registries[kind]

    def registry(self) -> StateRegistry:
        """Everything: for checkpoints."""
        return self._registry("all", self._replicated + self._per_replica)

    def replicated(self) -> StateRegistry:
        """The state every data-parallel replica holds identically."""
        return self._registry("replicated", self._replicated)

    def per_replica(self) -> StateRegistry:
        """RNGs, carried tensors and extra objects."""
        return self._registry("per_replica", self._per_replica)

    def keys(self) -> List[str]:
        return [k for k, _ in self._replicated + self._per_replica]

    # ---- checkpoints

    def save(self, ckpt, *, background: bool = False,
             metadata: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Saves everything as checkpoint ``self.step``."""
        if background:
            return ckpt.save_async(self.step, self.registry(), metadata)
        return ckpt.save(self.step, self.registry(), metadata)

    def restore(self, ckpt, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """Loads the newest checkpoint (or ``step``); ``None`` when there is
        none (the state is then untouched)."""
        return ckpt.restore(self.registry(), step)


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
