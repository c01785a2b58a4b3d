"""Ready-made state objects for :class:`omni.StateRegistry`.

A state object is any object with two methods::

    def save(self, writer: omni.StateWriter) -> None: ...
    def load(self, reader: omni.StateReader) -> None: ...

``save`` writes tensors (``writer.put_tensor(key, array)``) and byte strings
(``writer.put_bytes(key, data)``) under keys relative to the object's name;
``load`` reads them back. ``load`` should check everything it needs
(``reader.find(key)``) before changing the object, so that a failed restore
leaves it untouched.

Here: Python's and numpy's random generators, numpy arrays updated in place,
JSON-serializable values and, when ``torch`` is importable, a module's
``state_dict``, an optimizer's state and torch's RNGs. None of them pickles:
a checkpoint never executes code when it is loaded.
"""

from __future__ import annotations

import json
import random as _random
from typing import Any, Dict, MutableMapping, Optional

__all__ = [
    "PythonRandomState",
    "NumpyRandomState",
    "ArrayState",
    "JsonState",
    "TorchModuleState",
    "TorchOptimizerState",
    "TorchRngState",
    "TorchSchedulerState",
    "TorchTensorsState",
]


def _np():
    import numpy

    return numpy


def _require(reader, key: str, dtype: Optional[str] = None, shape=None):
    """reader.find(key), checked against dtype and shape (ValueError naming the key)."""
    found_dtype, found_shape = reader.find(key)
    if dtype is not None and found_dtype != dtype:
        raise ValueError(f"'{key}': expected dtype {dtype}, the checkpoint has {found_dtype}")
    if shape is not None and tuple(found_shape) != tuple(shape):
        raise ValueError(
            f"'{key}': expected shape {tuple(shape)}, the checkpoint has {tuple(found_shape)}"
        )
    return found_dtype, found_shape


class PythonRandomState:
    """The state of Python's ``random`` module (or of a ``random.Random``).

    Keys: ``version`` (int64), ``mt`` (the 625 ints of the Mersenne Twister
    state, as int64) and ``gauss_next`` (float64, empty when ``None``).
    """

    def __init__(self, rng: Optional[_random.Random] = None) -> None:
        self._rng = rng if rng is not None else _random

    def save(self, writer) -> None:
        np = _np()
        version, internal, gauss_next = self._rng.getstate()
        writer.put_tensor("version", np.array([version], dtype=np.int64))
        writer.put_tensor("mt", np.array(internal, dtype=np.int64))
        gauss = [] if gauss_next is None else [gauss_next]
        writer.put_tensor("gauss_next", np.array(gauss, dtype=np.float64))

    def load(self, reader) -> None:
        np = _np()
        _require(reader, "version", "int64", (1,))
        _require(reader, "mt", "int64")
        _, gauss_shape = _require(reader, "gauss_next", "float64")
        if tuple(gauss_shape) not in ((0,), (1,)):
            raise ValueError(f"'gauss_next': expected shape (0,) or (1,), got {gauss_shape}")
        version = int(reader.read_tensor("version")[0])
        internal = tuple(int(x) for x in reader.read_tensor("mt"))
        gauss = reader.read_tensor("gauss_next")
        gauss_next = float(gauss[0]) if gauss.size else None
        self._rng.setstate((version, internal, gauss_next))


def _to_json(value: Any) -> Any:
    np = _np()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    np = _np()
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.array(value["__ndarray__"], dtype=np.dtype(value["dtype"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


class NumpyRandomState:
    """The state of numpy's legacy global generator (``numpy.random.seed`` /
    ``numpy.random.rand`` ...), of a ``numpy.random.RandomState``, or of a
    ``numpy.random.Generator`` / ``BitGenerator``.

    Legacy (MT19937) keys: ``keys`` (624 words, int64), ``pos``,
    ``has_gauss`` (int64) and ``cached_gaussian`` (float64). A Generator's
    ``bit_generator.state`` dict is stored as JSON under ``bit_generator``.
    """

    def __init__(self, rng: Any = None) -> None:
        np = _np()
        if rng is None:
            rng = np.random.mtrand._rand  # the legacy global RandomState
        if isinstance(rng, np.random.Generator):
            rng = rng.bit_generator
        self._rng = rng
        self._legacy = isinstance(rng, np.random.RandomState)

    def save(self, writer) -> None:
        np = _np()
        if self._legacy:
            name, keys, pos, has_gauss, cached = self._rng.get_state(legacy=True)
            if name != "MT19937":
                raise ValueError(f"unsupported legacy bit generator {name}")
            writer.put_tensor("keys", np.asarray(keys, dtype=np.uint32).astype(np.int64))
            writer.put_tensor("pos", np.array([pos, has_gauss], dtype=np.int64))
            writer.put_tensor("cached_gaussian", np.array([cached], dtype=np.float64))
        else:
            state = json.dumps(_to_json(self._rng.state), sort_keys=True)
            writer.put_bytes("bit_generator", state.encode("utf-8"))

    def load(self, reader) -> None:
        np = _np()
        if self._legacy:
            _require(reader, "keys", "int64", (624,))
            _require(reader, "pos", "int64", (2,))
            _require(reader, "cached_gaussian", "float64", (1,))
            keys = reader.read_tensor("keys")
            if keys.min() < 0 or keys.max() > 0xFFFFFFFF:
                raise ValueError("'keys': not 32-bit words")
            pos, has_gauss = (int(x) for x in reader.read_tensor("pos"))
            cached = float(reader.read_tensor("cached_gaussian")[0])
            self._rng.set_state(("MT19937", keys.astype(np.uint32), pos, has_gauss, cached))
        else:
            state = _from_json(json.loads(reader.read_bytes("bit_generator").decode("utf-8")))
            expected = type(self._rng).__name__
            if state.get("bit_generator") != expected:
                raise ValueError(
                    f"'bit_generator': the checkpoint holds a {state.get('bit_generator')} state, "
                    f"this generator is a {expected}"
                )
            self._rng.state = state


class ArrayState:
    """Named numpy arrays (a model's weights, an optimizer's moments), saved
    as they are and restored *in place* (same dtype and shape required; the
    dict's arrays keep their identity). ``arrays`` may be any mutable
    mapping; its current contents are saved."""

    def __init__(self, arrays: MutableMapping[str, Any]) -> None:
        self.arrays = arrays

    def save(self, writer) -> None:
        for name, array in self.arrays.items():
            writer.put_tensor(name, array)

    def load(self, reader) -> None:
        np = _np()
        for name, array in self.arrays.items():  # check everything first
            _require(reader, name, np.asarray(array).dtype.name, np.shape(array))
        for name, array in self.arrays.items():
            reader.read_tensor_into(name, array)


class JsonState:
    """A dict of JSON-serializable values (counters, hyper-parameters,
    config), saved as one JSON blob under ``json`` and restored into the same
    dict (``clear()`` then ``update()``)."""

    def __init__(self, values: Optional[Dict[str, Any]] = None) -> None:
        self.values: Dict[str, Any] = values if values is not None else {}

    def save(self, writer) -> None:
        writer.put_bytes("json", json.dumps(self.values, sort_keys=True).encode("utf-8"))

    def load(self, reader) -> None:
        values = json.loads(reader.read_bytes("json").decode("utf-8"))
        if not isinstance(values, dict):
            raise ValueError("'json': expected a JSON object")
        self.values.clear()
        self.values.update(values)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.values[key] = value


# ---------------------------------------------------------------- torch (optional)


def _torch():
    import torch  # optional dependency: only these classes need it

    return torch


def _tensor_numpy(t):
    """A CPU numpy view (or copy) of a tensor's values."""
    return t.detach().cpu().contiguous().numpy()


class TorchModuleState:
    """A ``torch.nn.Module``'s ``state_dict()`` (parameters and buffers),
    one tensor per entry, loaded with ``copy_`` into the existing tensors
    (shapes and dtypes must match; everything is checked before anything is
    copied). CPU tensors are read straight into their memory."""

    def __init__(self, module) -> None:
        self.module = module

    def save(self, writer) -> None:
        for name, tensor in self.module.state_dict().items():
            writer.put_tensor(name, _tensor_numpy(tensor))

    def load(self, reader) -> None:
        torch = _torch()
        state = self.module.state_dict()
        for name, tensor in state.items():
            dtype = str(tensor.dtype).replace("torch.", "")
            _require(reader, name, dtype, tuple(tensor.shape))
        with torch.no_grad():
            for name, tensor in state.items():
                if tensor.device.type == "cpu" and tensor.is_contiguous():
                    reader.read_tensor_into(name, tensor.detach().numpy())
                else:
                    tensor.copy_(torch.from_numpy(reader.read_tensor(name)))


class TorchOptimizerState:
    """A ``torch.optim.Optimizer``'s state: per-parameter tensors under
    ``param/<i>/<name>``, everything else (``param_groups``, scalar state)
    as JSON under ``meta``; loaded with ``optimizer.load_state_dict``."""

    def __init__(self, optimizer) -> None:
        self.optimizer = optimizer

    def save(self, writer) -> None:
        torch = _torch()
        sd = self.optimizer.state_dict()
        scalars: Dict[str, Dict[str, Any]] = {}
        for index, entries in sd["state"].items():
            for name, value in entries.items():
                if isinstance(value, torch.Tensor):
                    writer.put_tensor(f"param/{index}/{name}", _tensor_numpy(value))
                else:
                    scalars.setdefault(str(index), {})[name] = value
        meta = {"param_groups": sd["param_groups"], "scalars": scalars,
                "tensors": {str(i): [n for n, v in e.items() if isinstance(v, torch.Tensor)]
                            for i, e in sd["state"].items()}}
        writer.put_bytes("meta", json.dumps(meta, sort_keys=True).encode("utf-8"))

    def load(self, reader) -> None:
        torch = _torch()
        meta = json.loads(reader.read_bytes("meta").decode("utf-8"))
        state: Dict[int, Dict[str, Any]] = {}
        for index, names in meta["tensors"].items():
            for name in names:
                state.setdefault(int(index), {})[name] = torch.from_numpy(
                    reader.read_tensor(f"param/{index}/{name}"))
        for index, values in meta["scalars"].items():
            state.setdefault(int(index), {}).update(values)
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


class TorchRngState:
    """torch's CPU generator (``torch.get_rng_state()``) under ``cpu`` and,
    when CUDA is available, every device's generator under ``cuda/<i>``."""

    def save(self, writer) -> None:
        torch = _torch()
        writer.put_tensor("cpu", torch.get_rng_state().numpy())
        if torch.cuda.is_available():
            for i, state in enumerate(torch.cuda.get_rng_state_all()):
                writer.put_tensor(f"cuda/{i}", state.numpy())

    def load(self, reader) -> None:
        torch = _torch()
        cpu = reader.read_tensor("cpu")
        cuda = []
        if torch.cuda.is_available():
            cuda = [reader.read_tensor(f"cuda/{i}") for i in range(torch.cuda.device_count())]
        torch.set_rng_state(torch.from_numpy(cpu))
        for i, state in enumerate(cuda):
            torch.cuda.set_rng_state(torch.from_numpy(state), i)


def _tensor_to_json(value: Any) -> Any:
    """A scheduler state value as JSON (tensors and numpy values as lists)."""
    if hasattr(value, "detach") and hasattr(value, "tolist"):  # a torch tensor
        return {"__tensor__": value.detach().cpu().tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {str(k): _tensor_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tensor_to_json(v) for v in value]
    return _to_json(value)


def _tensor_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__tensor__" in value:
            torch = _torch()
            return torch.tensor(value["__tensor__"],
                                dtype=getattr(torch, value["dtype"].replace("torch.", "")))
        return {k: _tensor_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensor_from_json(v) for v in value]
    return _from_json(value)


class TorchSchedulerState:
    """A ``torch.optim.lr_scheduler`` scheduler's ``state_dict()`` (epoch
    counters, base and last learning rates ...) as JSON under ``json``,
    loaded with ``load_state_dict``. Works for any object with
    ``state_dict()`` / ``load_state_dict()`` whose state is JSON-like (a
    ``GradScaler`` too). Functions in a LambdaLR are not state: they come
    from the code, as in torch."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def save(self, writer) -> None:
        state = _tensor_to_json(self.scheduler.state_dict())
        writer.put_bytes("json", json.dumps(state, sort_keys=True).encode("utf-8"))

    def load(self, reader) -> None:
        state = json.loads(reader.read_bytes("json").decode("utf-8"))
        if not isinstance(state, dict):
            raise ValueError("'json': expected a JSON object")
        self.scheduler.load_state_dict(_tensor_from_json(state))


class TorchTensorsState:
    """Tensors carried from one batch to the next (an RNN's hidden state,
    an EMA) in a dict ``{name: tensor, or tuple/list of tensors, or None}``.
    Saved under ``<name>`` (a tensor), ``<name>/<i>`` (a tuple or list) and
    ``__layout__`` (JSON: the structure and devices); loading *replaces* the
    dict's entries with new tensors on the devices they were saved from (the
    CPU when that device is absent). ``None`` entries stay ``None``."""

    def __init__(self, tensors: Optional[Dict[str, Any]] = None) -> None:
        self.tensors: Dict[str, Any] = tensors if tensors is not None else {}

    def save(self, writer) -> None:
        layout: Dict[str, Any] = {}
        for name, value in self.tensors.items():
            if value is None:
                layout[name] = None
            elif isinstance(value, (tuple, list)):
                layout[name] = {"kind": type(value).__name__,
                                "devices": [str(t.device) for t in value]}
                for i, t in enumerate(value):
                    writer.put_tensor(f"{name}/{i}", _tensor_numpy(t))
            else:
                layout[name] = {"kind": "tensor", "devices": [str(value.device)]}
                writer.put_tensor(name, _tensor_numpy(value))
        writer.put_bytes("__layout__", json.dumps(layout, sort_keys=True).encode("utf-8"))

    def load(self, reader) -> None:
        torch = _torch()
        layout = json.loads(reader.read_bytes("__layout__").decode("utf-8"))

        def read(key: str, device: str):
            t = torch.from_numpy(reader.read_tensor(key))
            try:
                return t.to(device)
            except (RuntimeError, AssertionError):
                return t  # that device is not here: keep it on the CPU

        loaded: Dict[str, Any] = {}
        for name, entry in layout.items():
            if entry is None:
                loaded[name] = None
            elif entry["kind"] == "tensor":
                loaded[name] = read(name, entry["devices"][0])
            else:
                items = [read(f"{name}/{i}", d) for i, d in enumerate(entry["devices"])]
                loaded[name] = tuple(items) if entry["kind"] == "tuple" else items
        self.tensors.clear()
        self.tensors.update(loaded)

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.tensors[name] = value
