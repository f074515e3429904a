"""feed.py — a Python iterable of (inputs, targets) [batch, seq] as dw_train's next_batch and
val_batch callbacks (include/deepwell.h), so that fit() over an iterable runs the C trainer.

Each call copies one batch into the trainer's int32 buffers after checking its shape and dtype;
ids outside the vocabulary are refused by the library (naming the micro-batch and position). An
exception inside the iterable (or a bad batch) is kept, the callback returns failure, dw_train
stops without finishing the step, and fit() re-raises the original exception.
"""
import ctypes

import numpy as np

from . import _structs as S
from .engine import _tokens


def _fill(buf, b, t, a, what):
    """Copies batch array a into the C buffer buf (b, t), after checking its shape."""
    a = _tokens(a, what)
    if a.shape != (b, t):
        raise ValueError(f"{what}: shape {tuple(a.shape)}, expected (batch, seq) = ({b}, {t})")
    np.ctypeslib.as_array(buf, shape=(b, t))[...] = a


class Feeder:
    """train (restarted with iter() when it ends: a new epoch) and val (restarted at each
    validation's first micro-batch) as callbacks; .failure holds the first exception raised."""

    def __init__(self, train, val=None):
        self.train, self.val = train, val
        self.it = self.vit = None
        self.failure = None
        self.next_batch = S.BATCH_FN(self._next)
        self.val_batch = S.BATCH_FN(self._val) if val is not None else S.BATCH_FN()

    def _pair(self, item, what):
        try:
            x, y = item
        except (TypeError, ValueError):
            raise TypeError(f"{what} must yield (inputs, targets) pairs, got {type(item).__name__}") from None
        return x, y

    def _next(self, _user, index, tokens, targets, b, t):
        try:
            if self.it is None:
                self.it = iter(self.train)
            try:
                item = next(self.it)
            except StopIteration:
                self.it = iter(self.train)  # a new epoch
                try:
                    item = next(self.it)
                except StopIteration:
                    raise ValueError(f"dataloader yielded nothing at micro-batch {index} (an iterator is read "
                                     "once: give a list, a DataLoader or an endless generator)") from None
            x, y = self._pair(item, "dataloader")
            _fill(tokens, b, t, x, f"dataloader micro-batch {index} inputs")
            _fill(targets, b, t, y, f"dataloader micro-batch {index} targets")
            return 0
        except BaseException as e:  # ctypes would print and drop it: fail, and fit() re-raises it
            self.failure = self.failure or e
            return 2

    def _val(self, _user, index, tokens, targets, b, t):
        try:
            if index == 0:
                self.vit = iter(self.val)
            try:
                item = next(self.vit)
            except StopIteration:
                return 1
            x, y = self._pair(item, "val")
            _fill(tokens, b, t, x, f"val micro-batch {index} inputs")
            _fill(targets, b, t, y, f"val micro-batch {index} targets")
            return 0
        except BaseException as e:
            self.failure = self.failure or e
            return 2

    def install(self, opts):
        """Points the dw_train_opts at these callbacks (keep self alive while dw_train runs)."""
        opts.next_batch = self.next_batch
        if self.val is not None:
            opts.val_batch = self.val_batch
        opts.batch_user = ctypes.c_void_p()
