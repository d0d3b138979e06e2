"""The lifetime of an object that owns one C handle (flashkv.Engine, flashkv.KVCache): close() frees it once (also
from the destructor and `with`); a call on a closed object raises ValueError naming 'self'."""
from __future__ import annotations

import contextlib
import ctypes


class OwnedHandle:
    """Base of the classes that own a C handle in `self._h` (a ctypes.c_void_p, None once closed).

    Subclasses set `_kind` (the class name for messages) and `_free(h)` (the C function that frees the handle). Where
    the object has a `_lock` (threading.Lock), close() takes it, so that it never overlaps a call running in another
    thread.
    """

    _kind = "object"
    _h: ctypes.c_void_p | None = None  # also the state of an object whose __init__ raised before the handle existed

    def _free(self, h: ctypes.c_void_p) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Frees the handle (idempotent); also called by the destructor and `with`."""
        lock = getattr(self, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            if self._h is not None:
                self._free(self._h)
                self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _handle(self) -> ctypes.c_void_p:
        """The open handle; ValueError naming 'self' once closed."""
        if self._h is None:
            raise ValueError(f"flashkv: argument 'self': expected an open {self._kind}, got a closed one")
        return self._h
