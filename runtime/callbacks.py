"""The dispatcher through which compiled code calls Python back (host callbacks, ir/host.py).

A compiled `host_callback` calls `tracer_host_callback(number, buffers)` (codegen/render_kernel.py): a
ctypes callback registered by name (runtime/loader.py), so no address is in the IR or in cached object
code. It finds the callback by its number, runs it on copies of the operand buffers (the Python
code may keep them, as a Function's ctx.save_for_backward does, while the arena is reused) and
writes its results into the result buffers. ctypes takes the GIL for the call: the entry runs
without it (runtime/compiled.py calls it through a CFUNCTYPE), and a callback kernel is never
split across the pool's threads (ir/loops.py `splittable`), so it runs on the caller's thread.

An exception the Python code raises cannot cross the native frames: it is kept here for the
calling thread and the dispatcher returns 1, so that the kernel records a failure and the entry
stops; `raise_failure` raises it where the runtime reads the error record.
"""
from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from tracer.codegen.symbols import HOST_CALLBACK_SYMBOL
from tracer.ir.host import HostCallback
from tracer.runtime import loader

_DISPATCHER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p)
_failures = threading.local()  # .error: the exception of this thread's last failed callback


def needed_by(code: str | bytes) -> bool:
    """Whether LLVM IR text or object code calls the dispatcher."""
    return (HOST_CALLBACK_SYMBOL if isinstance(code, str)
            else HOST_CALLBACK_SYMBOL.encode()) in code


def _view(address: int, value_type) -> np.ndarray:
    """The buffer at `address` as an array of `value_type` (shape and dtype)."""
    count = value_type.size * value_type.dtype.itemsize
    if count == 0:
        return np.empty(value_type.shape, value_type.dtype)
    memory = (ctypes.c_char * count).from_address(address)
    return np.frombuffer(memory, value_type.dtype).reshape(value_type.shape)


def _dispatch(number: int, buffers: int) -> int:
    try:
        callback = HostCallback.numbered[number]
        operand_types, result_types = callback.operand_types, callback.result_types
        pointers = (ctypes.c_void_p * (len(operand_types) + len(result_types))).from_address(
            buffers)
        operands = [_view(pointers[i] or 0, t).copy() for i, t in enumerate(operand_types)]
        results = callback(*operands)
        for position, (result, value_type) in enumerate(zip(results, result_types)):
            target = _view(pointers[len(operand_types) + position] or 0, value_type)
            if np.shape(result) != target.shape:  # run checked it: a bug of ours, not numpy's
                raise ValueError(f"{callback!r} result {position} has shape {np.shape(result)}, "
                                 f"its buffer {target.shape}")
            np.copyto(target, result, casting="no")
        return 0
    except BaseException as error:  # noqa: BLE001 - re-raised by raise_failure on return
        _failures.error = error
        return 1


_dispatcher = _DISPATCHER_TYPE(_dispatch)


@functools.cache
def register() -> None:
    """Make the dispatcher resolvable for JIT code (once per process)."""
    loader.add_symbol(HOST_CALLBACK_SYMBOL, ctypes.cast(_dispatcher, ctypes.c_void_p).value)


def raise_failure() -> None:
    """Raise the exception of the callback that failed in this thread's last call."""
    error = getattr(_failures, "error", None)
    _failures.error = None
    if error is None:
        raise RuntimeError("a host callback failed, but its exception was not kept")
    raise error
