"""_core.py — errors, the context, and the base of every handle-owning object.

A C error becomes a DeepwellError subclass chosen by its dw_status, carrying dw_errmsg's text
(which names the file, field or value). A Context owns a dw_ctx; each thread gets its own default
one (a dw_ctx belongs to one thread at a time). Handle objects keep the context (and whatever else
their C handle borrows) alive, free their handle once on close(), on `with` exit, or when collected.
"""
import ctypes
import json
import threading

from . import _structs as S
from ._lib import lib, take_string, text


class DeepwellError(RuntimeError):
    """A Deepwell call failed; str(e) is the library's message; .status its dw_status name."""

    status = "DW_ERR"

    def __init__(self, message, status=None):
        super().__init__(message)
        if status:
            self.status = status


class InvalidError(DeepwellError, ValueError):
    status = "DW_ERR_INVALID"


class NoMemoryError(DeepwellError, MemoryError):
    status = "DW_ERR_NOMEM"


class IOFailure(DeepwellError, OSError):
    status = "DW_ERR_IO"


class FormatError(DeepwellError, ValueError):
    status = "DW_ERR_FORMAT"


class UnsupportedError(DeepwellError, NotImplementedError):
    status = "DW_ERR_UNSUPPORTED"


class CudaError(DeepwellError):
    status = "DW_ERR_CUDA"


class NumericError(DeepwellError, ArithmeticError):
    status = "DW_ERR_NUMERIC"


_BY_STATUS = {1: InvalidError, 2: NoMemoryError, 3: IOFailure, 4: FormatError, 5: UnsupportedError, 6: CudaError,
              7: NumericError}


def raise_for(st, ctx=None):
    """Raises the exception of status st with dw_errmsg(ctx) (ctx: a Context, or None for the
    thread's context-free message)."""
    if st == 0:
        return
    msg = text(lib().dw_errmsg(ctx._h if ctx is not None else None)) or ""
    name = text(lib().dw_status_name(st))
    cls = _BY_STATUS.get(st, DeepwellError)
    raise cls(msg or name, name)


class Handle:
    """Owns one C handle: `_h` (a c_void_p value), freed by `_free` once."""

    _free = None  # name of the dw_*_free function

    def __init__(self, h, ctx=None, keep=()):
        self._h = h
        self._ctx = ctx
        self._keep = tuple(keep)  # objects the C handle borrows (a graph for a program, ...)

    @property
    def closed(self):
        return not self._h

    def _handle(self):
        if not self._h:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._h

    def close(self):
        h, self._h = self._h, None
        if h and self._free:
            getattr(lib(), self._free)(h)

    def _string(self, fn, *args):
        """A caller-owned string from fn(ctx, handle, *args, &out), checked and freed."""
        s = ctypes.c_void_p()
        self._ctx.check(getattr(lib(), fn)(self._ctx._h, self._handle(), *args, ctypes.byref(s)))
        return take_string(s.value)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class JsonDoc:
    """to_json()/to_dict() of a handle through its dw_*_to_json(ctx, handle, pretty, &out)."""

    _to_json = None

    def to_json(self, pretty=False):
        return self._string(self._to_json, pretty)

    def to_dict(self):
        return json.loads(self.to_json())


DEVICES = {"cpu": 0, "cuda": 1, "auto": 2}


class Context(Handle):
    """A dw_ctx on a device: "cpu" (the exact reference backend), "cuda" (GPU device_index) or
    "auto" (CUDA when a usable GPU is present). One thread at a time."""

    _free = "dw_ctx_free"

    def __init__(self, device="cpu", device_index=0):
        if device not in DEVICES:
            raise ValueError(f"device must be one of {sorted(DEVICES)}, got {device!r}")
        o = S.CtxOpts(DEVICES[device], device_index)
        h = ctypes.c_void_p()
        st = lib().dw_ctx_create(ctypes.byref(o), ctypes.byref(h))
        raise_for(st, None)
        super().__init__(h.value)

    @property
    def device(self):
        return "cuda" if lib().dw_ctx_device(self._handle()) == 1 else "cpu"

    def check(self, st):
        raise_for(st, self)

    def __repr__(self):
        return f"Context(device={self.device!r})" if self._h else "Context(closed)"


_local = threading.local()


def default_context(device=None):
    """The calling thread's context for `device` (default "cpu"), created on first use."""
    device = device or "cpu"
    cache = getattr(_local, "ctx", None)
    if cache is None:
        cache = _local.ctx = {}
    if device not in cache:
        cache[device] = Context(device)
    return cache[device]


def ctx_of(ctx, device=None):
    """A Context from an argument: a Context, a device name, or None (the thread's default)."""
    if isinstance(ctx, Context):
        return ctx
    return default_context(ctx or device)
