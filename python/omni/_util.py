"""Small helpers shared by the facade modules (private)."""

from __future__ import annotations


def add_note(exc: BaseException, note: str) -> None:
    """Attaches ``note`` to ``exc`` where Python supports notes (>= 3.11)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)


class ClosingContext:
    """``with obj:`` closes ``obj`` on exit. When the body raised and closing
    fails too, the closing error becomes a note on the body's exception
    instead of replacing it. Subclasses set ``_closing_what`` and ``close()``.
    """

    _closing_what = "object"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            self.close()
            return False
        try:
            self.close()
        except Exception as close_error:  # noqa: BLE001
            add_note(exc, f"omni: closing the {self._closing_what} also failed: {close_error}")
        return False

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
