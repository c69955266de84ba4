"""The caller's tensors as compiled code sees them: the arrays a call reads and writes, what a
compiled signature assumes of each tensor, its results as tensors, and the write-back of what the
call changed. runtime/ reaches tensors only through these (and `Trace`), never through Tensor's
private members."""
from __future__ import annotations

import operator
from typing import Container, Sequence

import numpy as np

from tracer.errors import user_line
from tracer.tensor import Tensor, check_current


def is_traced(tensor: Tensor) -> bool:
    """Whether `tensor` belongs to a trace (one that escaped it, when a call is made)."""
    return tensor._trace is not None


def buffer_of(value: Tensor | np.ndarray) -> np.ndarray:
    """The array holding an eager tensor's data (a numpy array is its own)."""
    return value._handle if isinstance(value, Tensor) else value


def tensor_buffers(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """The arrays holding eager tensors' data: `buffer_of` of each, for a list known to hold
    tensors only."""
    return list(map(_HANDLE, tensors))


_HANDLE = operator.attrgetter("_handle")


def grad_buffer_of(tensor: Tensor) -> np.ndarray | None:
    """The array holding an eager tensor's `.grad`, None without one."""
    grad = tensor._grad
    return None if grad is None else grad._handle


def grad_of(tensor: Tensor) -> Tensor | None:
    """An eager tensor's `.grad`, read outside any trace (the property looks for the thread's
    trace first, a thread-local read that costs as much as the rest of a call's alias handling)."""
    return tensor._grad


def view_of(value) -> str | None:
    """The view operation whose copy `value` is (tensor.mark_view), None for anything else."""
    return value._view_of if isinstance(value, Tensor) else None


def state_of(tensor: Tensor) -> tuple:
    """What a compiled signature assumes of a tensor: (shape, dtype, requires_grad, and (shape,
    dtype) of its .grad or None)."""
    return call_state_of(tensor)[:4]


def call_state_of(tensor: Tensor) -> tuple:
    """`state_of(tensor)` and whether it belongs to a trace, in one tuple: what a call's quick key
    holds for a tensor argument (see TracedFunction._quick_key; the one place the fields are
    read, so that the key costs one call a tensor)."""
    if tensor._view_base is not None:  # a view-copy read after its base changed: refused, as
        check_current(tensor)  # eager operations refuse it
    array, grad = tensor._handle, tensor._grad
    return (array.shape, array.dtype, tensor._requires_grad,
            None if grad is None else (grad._handle.shape, grad._handle.dtype),
            tensor._trace is not None)


def owned(array: np.ndarray, inputs: set[int] | None) -> np.ndarray:
    """`array`, copied if it is (or views) a buffer the caller owns (`inputs`: their ids; None
    when every array of the call's is one it allocated)."""
    if inputs is None:
        return array
    if id(array) in inputs or array.base is not None or not array.flags.writeable:
        return np.array(array, copy=True)
    return array


def results(arrays: Sequence[np.ndarray], inputs: set[int] | None,
            skipped: Container[int] = ()) -> list[Tensor | None]:
    """A call's results as new eager tensors (see `owned`); None at the `skipped` positions
    (results that are tensors the caller has)."""
    if skipped:
        return [None if position in skipped else Tensor._make(owned(array, inputs), None, False)
                for position, array in enumerate(arrays)]
    if inputs is None:
        return [Tensor._make(array, None, False) for array in arrays]
    return [Tensor._make(owned(array, inputs), None, False) for array in arrays]


def write_back(values: Sequence, writebacks: Sequence[tuple[int, str, int]], cleared: Sequence[int],
               outputs: Sequence[np.ndarray], inputs: set[int] | None) -> None:
    """Write what a call changed into the caller's tensors and arrays (`values`; `writebacks` and
    `cleared` as `Trace.writebacks` lists them): data into their buffers, a `.grad` into its
    buffer or, where there was none or the function set it anew, a new one; a `.grad` set to
    None."""
    line = ""  # the call's line, found once if at all, where a tensor changed
    for index, kind, output in writebacks:
        target, array = values[index], outputs[output]
        if kind == "data":
            buffer = buffer_of(target)
            if array is not buffer:  # an output written in place is the argument's array itself
                np.copyto(buffer, array)
            if isinstance(target, Tensor):
                line = line or user_line()
                target._mark_changed(line)
                if target._base is not None:  # a detach() alias: its original changed (eager's
                    target._base._mark_changed(line)  # _assign_data, PyTorch's shared version)
        elif target._grad is None or (kind == "new_grad" and array is not target._grad._handle):
            # a new .grad, as PyTorch's backward makes after zero_grad(set_to_none=True)
            target._grad = Tensor._make(owned(array, inputs), None, False)
        else:
            if array is not target._grad._handle:
                np.copyto(target._grad._handle, array)
            line = line or user_line()
            target._grad._mark_changed(line)
    for index in cleared:
        values[index]._grad = None
