"""tcp:// and env:// stores: c10d's C++ client, or the user's torch.

``omni.open_store("tcp://...")`` (and the Runtime's store, and torchrun's
MASTER_ADDR / MASTER_PORT) reach :func:`open`. Where this build has
omni._torch_C (LibTorch found) and the torch imported in the process maps the
libtorch_cpu file it links, it returns omni._torch_C's opener, and omni._C
opens the store with c10d's C++ client (omni::torch_ext::TcpStore), never
touching torch's Python binding. Otherwise (a build without LibTorch, or
another torch) it builds a ``torch.distributed.TCPStore`` and wraps it in
:class:`TorchStore`, which has omni::Store's semantics
(include/omni/store.h); python/src/store.cc adapts it to the C++ interface,
taking the GIL for each call. ``omni.open_store(torch_store_object)`` always
uses :class:`TorchStore`.

URIs are the C++ adapter's (include/omni/torch/store.h):

    tcp://HOST:PORT[?server=1&timeout=60s&secret_file=PATH&insecure=1]
    env://[?...]     HOST:PORT from MASTER_ADDR / MASTER_PORT; this process
                     serves when RANK is 0 and torchrun's agent does not
                     (TORCHELASTIC_USE_AGENT_STORE != "True")

How omni's operations map onto c10d's (the same as src/torch/tcp_store.cc):
a read is an atomic compare-set against a reserved probe value (c10d's get
would block on a missing key); add checks the current value first (the
server drops the connection on a non-counter); a compare-set with an empty
``expected`` reads first and only then creates. Calls on one connection take
turns (a lock); the first failed call latches: every later call raises
``ConnectionError`` naming it (omni: Unavailable, a store failure).

torch < 2.4's ``compare_set`` builds the bytes it returns without the GIL
(PyTorch issue #125990): with another Python thread running, the process can
crash (hence the C++ client, and a warning when a URI cannot use it). So
in :class:`TorchStore` a key this connection has seen exist (written,
created or read) is read with ``get``, which holds the GIL for its bytes
and cannot block on a key that exists: omni never deletes its keys, and
``delete`` here forgets the key. A key deleted by another client after this one saw it makes the
next read wait for the store's timeout (``TimeoutError``, latched). Only a
key's first reads, compare-and-set itself and the reads of keys not there
yet still go through ``compare_set``.
"""

from __future__ import annotations

import builtins
import datetime
import ipaddress
import os
import re
import threading
import warnings
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["TorchStore", "open", "parse_uri"]

_PROBE1 = b"\0omni.tcpstore.absent.probe.1"
_PROBE2 = b"\0omni.tcpstore.absent.probe.2"
_FLUSH = "\0omni.tcpstore.flush"  # a counter nobody reads
_INT64 = (-(2**63), 2**63 - 1)
_FORM = "expected tcp://host:port[?server=1&timeout=60s] or env://[?...]"


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "::1"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TorchStore:
    """omni::Store semantics over a ``torch.distributed.Store`` (a
    ``TCPStore``, torchrun's store, a ``PrefixStore`` of one...).

    ``label`` prefixes every error; ``host``, ``port`` and ``is_server``
    describe what the store exposes to other hosts (see ``exposure``).
    """

    def __init__(self, store: Any, label: str, host: str = "", port: int = 0,
                 is_server: bool = False) -> None:
        self._store = store
        self.label = label
        self.host = host
        self.port = port
        self.is_server = is_server
        self._lock = threading.Lock()
        self._broken: Optional[str] = None
        self._seen: set = set()  # keys known to exist: read with get (module docstring)

    @property
    def torch_store(self) -> Any:
        """The torch store underneath."""
        return self._store

    def _call(self, what: str, key: str, op: Callable[[Any], Any]) -> Any:
        with self._lock:
            if self._broken is not None:
                raise ConnectionError(
                    f"{self.label}: {what} of key '{key}': the connection failed earlier: "
                    f"{self._broken}")
            try:
                return op(self._store)
            except Exception as e:  # c10d raises RuntimeError for I/O and protocol errors
                self._broken = f"{what} of key '{key}': {e}"
                raise ConnectionError(f"{self.label}: {self._broken}") from e

    def _read(self, key: str) -> Optional[bytes]:
        if key in self._seen:
            return bytes(self._call("read", key, lambda s: s.get(key)))
        for probe in (_PROBE1, _PROBE2):
            value = self._call("read", key, lambda s, p=probe: s.compare_set(key, p, p))
            if value != probe:
                self._seen.add(key)
                return bytes(value)
        return None

    # ---- omni::Store

    def set(self, key: str, value: bytes) -> None:
        def op(s):
            s.set(key, value)
            if not value:
                # torch 1.x sends the key with MSG_MORE and nothing after an
                # empty value, so it sits in the kernel for 200 ms; another
                # request flushes it at once (an add: compare_set is unsafe).
                s.add(_FLUSH, 0)
        self._call("set", key, op)
        self._seen.add(key)

    def try_get(self, key: str) -> Optional[bytes]:
        return self._read(key)

    def add(self, key: str, delta: int) -> int:
        current = self._read(key)
        if current is not None:
            if not re.fullmatch(rb"[+-]?[0-9]+", current):
                raise ValueError(f"{self.label}: key '{key}' holds {current!r}, not a counter")
            total = int(current) + delta
            if not _INT64[0] <= total <= _INT64[1]:
                raise OverflowError(
                    f"{self.label}: key '{key}': {int(current)} + {delta} overflows int64")
        total = int(self._call("add", key, lambda s: s.add(key, delta)))
        self._seen.add(key)
        return total

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        if not expected:
            # Create if absent; c10d would also swap an existing "".
            current = self._read(key)
            if current is not None:
                return current
            created = bytes(self._call("compare-and-set", key,
                                       lambda s: s.compare_set(key, expected, desired)))
            self._seen.add(key)
            return created
        result = bytes(self._call("compare-and-set", key,
                                  lambda s: s.compare_set(key, expected, desired)))
        if result != expected:
            self._seen.add(key)  # it holds another value, or now the desired one
            return result
        # c10d answers `expected` both for a missing key and (expected ==
        # desired) for a matching one.
        if expected == desired:
            current = self._read(key)
            if current is not None:
                return current
        raise KeyError(f"{self.label}: compare-and-set of missing key '{key}' expected a value")

    def delete(self, key: str) -> bool:
        self._seen.discard(key)
        return bool(self._call("delete", key, lambda s: s.delete_key(key)))

    def check(self, keys: List[str]) -> bool:
        if hasattr(self._store, "check"):  # torch >= 2.0
            return bool(self._call("check", "', '".join(keys), lambda s: s.check(list(keys))))
        return all(self._read(key) is not None for key in keys)

    def exposure(self) -> Tuple[str, str]:
        """(remote, wildcard): who besides this host reaches the records."""
        remote = "" if not self.host or _is_loopback(self.host) else \
            f"connects to {self.host}:{self.port}"
        wildcard = (f"serves port {self.port} on every interface (torch's TCPStore has no "
                    "bind address)") if self.is_server else ""
        return remote, wildcard

    def __repr__(self) -> str:
        return f"<omni TorchStore {self.label}>"


def _bad(uri: str, why: str) -> ValueError:
    return ValueError(f"store URI '{uri}' {why}; {_FORM}")


def _port(text: str) -> Optional[int]:
    if not re.fullmatch(r"[0-9]{1,5}", text or "") or int(text) > 65535:
        return None
    return int(text)


def _duration_s(text: str) -> Optional[float]:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)(ms|s|m|h)", text)
    if not m:
        return None
    value = float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return value if value > 0 else None


def parse_uri(uri: str) -> dict:
    """``{"host", "port", "server", "timeout_s"}`` of a tcp:// or env:// URI
    (``ValueError`` naming the URI or variable otherwise)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise _bad(uri, "has no scheme")
    rest, _, query = rest.partition("?")
    server: Optional[bool] = None
    timeout_s = 60.0
    for item in filter(None, query.split("&")):
        name, _, value = item.partition("=")
        if name == "server":
            if value not in ("1", "0", "true", "false"):
                raise _bad(uri, f"has server='{value}' (expected 1 or 0)")
            server = value in ("1", "true")
        elif name == "timeout":
            parsed = _duration_s(value)
            if parsed is None:
                raise _bad(uri, f"has timeout='{value}' (expected a positive duration such as 30s)")
            timeout_s = parsed
        elif name == "secret_file":
            if not value:
                raise _bad(uri, "has an empty secret_file")
        elif name == "insecure":
            if value not in ("1", "true"):
                raise _bad(uri, f"has insecure='{value}' (expected 1)")
        else:
            raise _bad(uri, f"has an unknown option '{name}' (known: server, timeout, "
                            "secret_file, insecure)")
    if scheme == "env":
        if rest:
            raise _bad(uri, "names a host; env:// takes it from MASTER_ADDR")
        host = os.environ.get("MASTER_ADDR", "")
        if not host:
            raise _bad(uri, "needs MASTER_ADDR in the environment (as torchrun sets it)")
        port_text = os.environ.get("MASTER_PORT")
        port = _port(port_text or "")
        if not port:
            raise _bad(uri, "needs MASTER_PORT in the environment as a port 1..65535 (it is "
                            f"{'unset' if port_text is None else repr(port_text)})")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if server is None:
            server = (os.environ.get("RANK") == "0"
                      and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")
        return {"host": host, "port": port, "server": server, "timeout_s": timeout_s}
    if scheme != "tcp":
        raise _bad(uri, f"has scheme '{scheme}'")
    if "/" in rest:
        raise _bad(uri, "has a path")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0 or rest[close + 1:close + 2] != ":":
            raise _bad(uri, "has no ]:port after an IPv6 address")
        host, port_text = rest[1:close], rest[close + 2:]
    else:
        if ":" not in rest:
            raise _bad(uri, "has no port")
        if rest.count(":") > 1:
            raise _bad(uri, "has more than one ':' (write an IPv6 address as [addr]:port)")
        host, _, port_text = rest.partition(":")
    if not host:
        raise _bad(uri, "has no host")
    port = _port(port_text)
    if port is None:
        raise _bad(uri, f"has port '{port_text}' (expected 0..65535)")
    server = bool(server)
    if port == 0 and not server:
        raise _bad(uri, "has port 0, which only a server (server=1) may ask for")
    return {"host": host, "port": port, "server": server, "timeout_s": timeout_s}


_native: Optional[Tuple[Any, str]] = None  # (capsule or None, why not), once found


def _loaded_libraries() -> List[str]:
    """The files mapped into this process (Linux: /proc/self/maps)."""
    try:
        with builtins.open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return sorted({line.split(None, 5)[5].strip() for line in maps
                           if len(line.split(None, 5)) == 6})
    except OSError:
        return []


def native_api() -> Tuple[Any, str]:
    """``(capsule, "")`` when omni._torch_C can serve tcp:// and env:// in
    this process, else ``(None, why)``.

    omni._torch_C links the LibTorch omni was built with. It is loaded only
    when the torch imported here maps that very libtorch_cpu file, so that
    the process never holds two copies of LibTorch. Otherwise (a build
    without LibTorch, or another torch) the stores go through torch's Python
    binding (:class:`TorchStore`).
    """
    global _native
    if _native is not None:
        return _native
    try:
        from . import _torch_build  # written by the build where omni._torch_C is
    except ImportError:
        _native = (None, "this build of omni has no omni._torch_C (built without LibTorch)")
        return _native
    import torch  # noqa: F401 - the process's own torch, loaded first

    wanted = os.path.realpath(_torch_build.LIBTORCH_CPU)
    if not any(os.path.realpath(path) == wanted for path in _loaded_libraries()
               if "libtorch_cpu" in path):
        _native = (None, f"this process's torch {torch.__version__} is not the LibTorch "
                         f"{_torch_build.TORCH_VERSION} omni._torch_C links "
                         f"({_torch_build.LIBTORCH_CPU})")
        return _native
    try:
        from . import _torch_C
    except ImportError as e:  # e.g. libomni_torch.so not beside it
        _native = (None, f"omni._torch_C cannot be loaded: {e}")
        return _native
    _native = (_torch_C.api, "")
    return _native


def open(uri: str) -> Any:  # noqa: A001 - called by omni._C as omni._torch_store.open
    """The store of a tcp:// or env:// URI, checked first: omni._torch_C's
    opener (a capsule omni._C calls) where :func:`native_api` allows it, else
    a :class:`TorchStore` (starting the server with server=1, or connecting,
    retrying until the URI's timeout)."""
    o = parse_uri(uri)
    import torch.distributed as dist  # the user's torch; ImportError without it

    api, why = native_api()
    if api is not None:
        return api
    if tuple(int(x) for x in re.findall(r"[0-9]+", _torch_version())[:2]) < (2, 4):
        warnings.warn(f"store '{uri}' goes through torch's Python TCPStore binding: {why}. "
                      "Before torch 2.4 its compare_set can crash a process whose other "
                      "threads run Python (PyTorch issue #125990; docs/python.md)",
                      RuntimeWarning, stacklevel=2)
    try:
        store = dist.TCPStore(o["host"], o["port"], is_master=o["server"],
                              timeout=datetime.timedelta(seconds=o["timeout_s"]),
                              wait_for_workers=False, multi_tenant=True)
    except RuntimeError as e:
        where = f"{o['host']}:{o['port']}"
        if o["server"]:
            raise ConnectionError(f"TcpStore {where}: cannot start the server: {e}") from e
        raise ConnectionError(
            f"TcpStore {where}: cannot connect within {o['timeout_s']:g} s: {e}") from e
    port = int(store.port)
    return TorchStore(store, f"TcpStore {o['host']}:{port}", o["host"], port, o["server"])


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
