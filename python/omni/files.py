"""Telemetry files across attempts: rotation of a step log or trace that a
resumed run would otherwise truncate, and a trace reader that accepts a
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

__all__ = ["rotate", "read_trace"]

_Path = Union[str, "os.PathLike[str]"]


def rotate(path: Optional[_Path]) -> Optional[str]:
    """Moves a non-empty file at ``path`` aside to ``<path>.<n>``, the first
    free n >= 1 (so .1 is the first attempt's, .2 the second's ...), and
    returns the new name; ``None`` when there was nothing to move. An empty
    file is left to be overwritten."""
    if path is None:
        return None
    try:
        path = os.fspath(path)
    except TypeError:
        return None  # not a path: the telemetry names the option
    if not isinstance(path, str) or not path or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
    target = f"{path}.{n}"
    os.rename(path, target)
    return target


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
