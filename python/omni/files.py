"""Telemetry files across attempts: where a resumed run's telemetry moved
the previous step log and trace (the C++ side moves them), and a trace reader that accepts a
trace cut short by SIGKILL.

A trace is written in the Chrome JSON Array Format, one event per line
(``[`` first, a comma between events, ``]`` when the telemetry is
closed). A process killed mid-write leaves no ``]`` and possibly half an
event; Perfetto opens such a file, and ``read_trace`` returns every complete
event of it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Union

__all__ = ["read_trace"]

_Path = Union[str, "os.PathLike[str]"]


def previous_output(path: Optional[_Path]) -> Optional[str]:
    """``path`` as a string when a file exists there that the telemetry will
    move aside (keep_previous_outputs); ``None`` otherwise."""
    if path is None:
        return None
    try:
        path = os.fspath(path)
    except TypeError:
        return None  # not a path: the telemetry names the option
    return path if isinstance(path, str) and path and os.path.isfile(path) else None


def moved_to(path: str) -> str:
    """Where the telemetry moved the earlier ``path``: the highest
    ``<path>.<n>`` (it takes the first free n >= 1)."""
    n = 1
    while os.path.exists(f"{path}.{n + 1}"):
        n += 1
    return f"{path}.{n}"


def read_trace(path: _Path) -> List[Dict[str, Any]]:
    """The events of a trace written by ``omni.Telemetry(trace=...)``, also
    when its writer was killed: a missing ``]`` and a cut last event are
    accepted (the cut event is left out). ``ValueError`` naming the file and
    line for damage anywhere else."""
    path = os.fspath(path)
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    events: List[Dict[str, Any]] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, raw in enumerate(lines):
        line = raw.strip()
        if line.startswith("["):
            line = line[1:]
        if line.endswith("]") and i == last:
            line = line[:-1]
        line = line.strip().strip(",").strip()
        if not line:
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == last:
                break  # the event being written when the process died
            raise ValueError(f"{path}:{i + 1}: not a trace event: {e}") from None
    return events
