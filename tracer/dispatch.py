"""Where tensors come from: a primitive applied to tensors, or data. This is the one place that
branches on eager versus traced (`apply` runs the primitive's reference semantics on numpy arrays
and records it on the tape, or records it into the trace's graph); and the operands it takes:
Python numbers as weak constants, promoted to one dtype with the tensors beside them."""
from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np

from tracer.ir import types as irtypes
from tracer.ir.builder import normalize_attributes
from tracer.ir.primitives import NON_DIFFERENTIABLE, IndexRangeError, ShapeError
from tracer.autograd import ARRAYS, Node
from tracer.context import is_grad_enabled, state
from tracer.device import check_device, is_device
from tracer.dtypes import (CATEGORY, WEAK_OF_CATEGORY, as_dtype, bool, default_dtype, float32,
                           float64, int64, is_scalar, promotion, scalar_category)
from tracer.errors import ArgumentError, IndexOutOfRangeError, ShapeMismatchError, TracingError
from tracer.tensor import Tensor, check_current, mark_view
from tracer.tracing import escaped_error

# Primitives whose numpy result can be a view of an operand: eager mode copies it, because every
# eager tensor owns its buffer (in-place changes never reach another tensor).
_VIEWING = frozenset({"broadcast", "reshape", "transpose", "slice", "stop_gradient", "custom_vjp",
                      "iota"})


def current_handles(tensors: Sequence[Tensor]):
    for t in tensors:
        if t._view_base is not None:
            check_current(t)
    trace = state.trace
    if trace is None:
        for t in tensors:
            if t._trace is not None:
                raise escaped_error()
        return None, ARRAYS, [t._handle for t in tensors]
    return trace, trace.builder, [trace.handle_of(t) for t in tensors]


def apply(primitive: str, inputs: Sequence[Tensor], **attributes: Any) -> Tensor:
    """Run (eager) or record (traced) one primitive on tensors; the single door to both modes."""
    trace, builder, handles = current_handles(inputs)
    attributes = normalize_attributes(attributes)
    try:
        (result,) = builder.emit(primitive, handles, attributes)
    except ShapeError as error:
        raise ShapeMismatchError(str(error)) from None
    except IndexRangeError as error:  # eager gather or scatter at an index outside its dimension
        raise IndexOutOfRangeError(str(error)) from None
    differentiable = (primitive not in NON_DIFFERENTIABLE and irtypes.is_float(result.dtype))
    # (a loop over the slot, not any() over the property: this runs once per operation)
    inputs_require_grad = False
    for t in inputs:
        if t._requires_grad:
            inputs_require_grad = True
            break
    requires_grad = is_grad_enabled() and differentiable and inputs_require_grad
    if trace is not None:
        if differentiable and not requires_grad and (inputs_require_grad or (
                state.creating_graph and not is_grad_enabled())):
            # Recorded under no_grad: the autodiff pass must not differentiate through it (nor
            # through a no_grad block of a traced backward that records its graph, whose tensors
            # do not require grad but whose IR is differentiated again).
            (result,) = builder.emit("stop_gradient", [result], {})
        return Tensor._make(result, trace, requires_grad)
    if primitive in _VIEWING and (result.base is not None or not result.flags.writeable):
        result = result.copy()
    node = Node(primitive, attributes, inputs, handles, [result]) if requires_grad else None
    output = Tensor._make(result, None, requires_grad, node)
    if node is not None:
        node.save_outputs([output])
    return output


def constant(value, dtype) -> Tensor:
    return apply("constant", [], value=as_dtype(dtype).type(value).item(), dtype=dtype)


def leaf(array: np.ndarray, requires_grad: builtins.bool) -> Tensor:
    """An eager leaf tensor holding `array` itself."""
    if requires_grad and not irtypes.is_float(array.dtype):
        raise ArgumentError(f"only float tensors can require gradients, got {array.dtype}")
    return Tensor._make(array, None, builtins.bool(requires_grad), leaf=True)


def from_data(data, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers or a numpy array): eagerly a
    leaf; inside a trace a runtime input of it, captured as a constant (never written back)."""
    try:
        dtype = as_dtype(dtype) if dtype is not None else default_dtype(data)
        array = np.array(data, dtype=dtype, copy=True)
    except (ValueError, TypeError) as error:
        raise ArgumentError(f"cannot make a tensor of {type(data).__name__}: {error}") from None
    if state.trace is not None:
        if requires_grad:
            raise TracingError("tr.tensor(..., requires_grad=True) inside a traced function; "
                               "pass it as an argument")
        return Tensor._make(state.trace.capture(leaf(array, False), constant=True), state.trace,
                            False)
    return leaf(array, requires_grad)


def as_tensor(value, dtype=None, accept_data: builtins.bool = False) -> Tensor:
    """`value` as a Tensor: Tensors pass through, numbers become (weak) constants. Lists and
    arrays only where PyTorch takes them too (`accept_data`: `x[0] = [1, 2]`); an operand of an
    operation must be a Tensor, as in PyTorch."""
    if isinstance(value, Tensor):
        return value if dtype is None else value.to(dtype)
    if is_scalar(value):
        result = constant(value, dtype or WEAK_OF_CATEGORY[scalar_category(value)])
        result._weak = dtype is None
        return result
    if accept_data and isinstance(value, (np.ndarray, list, tuple)):
        return from_data(value, dtype=dtype)
    if isinstance(value, (np.ndarray, list, tuple)):
        raise ArgumentError(f"expected a Tensor or a number, got a {type(value).__name__}; wrap "
                            f"it in tr.tensor(...)")
    raise ArgumentError(f"expected a Tensor or a number, got {type(value).__name__}")


def tensor_operand(value, method: str) -> Tensor:
    """A method that reads only an operand's shape or dtype still takes only a Tensor (PyTorch)."""
    if not isinstance(value, Tensor):
        raise ArgumentError(f"{method}() takes a Tensor, got a {type(value).__name__}; wrap it in "
                            f"tr.tensor(...)")
    return value


def promote(*operands) -> list[Tensor]:
    dtype, weak = promotion(operands)
    results = []
    for operand in operands:
        # (promotion refused any operand that is neither a Tensor nor a real number)
        if isinstance(operand, Tensor):
            t = operand if operand.dtype == dtype else operand.to(dtype)
        else:
            t = constant(operand, dtype)
        t._weak = weak
        results.append(t)
    return results


def conversion_arguments(args, dtype, device, copy):
    """(dtype, device, copy) from the positional and keyword arguments of `Tensor.to`."""
    args = list(args)
    if args and isinstance(args[0], Tensor):
        other = args.pop(0)
        dtype = other.dtype if dtype is None else dtype
    elif args and is_device(args[0]):
        device = args.pop(0)
    if args and not isinstance(args[0], builtins.bool):
        if dtype is not None:
            raise ArgumentError("to() got the dtype twice")
        dtype = args.pop(0)
    if args:
        args.pop(0)  # non_blocking: every copy here is synchronous
    if args:
        copy = args.pop(0)
    if args:
        raise ArgumentError(f"to() takes (dtype), (device, dtype) or (tensor), then non_blocking "
                            f"and copy; got {len(args)} arguments more")
    return dtype, device, builtins.bool(copy)


class DispatchMethods:
    """Tensor's conversions and copies (given to Tensor by tracer/methods.py)."""

    def to(self, *args, dtype=None, device=None, non_blocking: builtins.bool = False,
           copy: builtins.bool = False, memory_format=None) -> Tensor:
        """PyTorch's forms: `to(dtype)`, `to(device, dtype=None)`, `to(other_tensor)`, each with
        `non_blocking` and `copy` after; the device can only be the CPU. `self` itself when
        nothing changes, unless `copy`."""
        dtype, device, copy = conversion_arguments(args, dtype, device, copy)
        check_device(device)
        dtype = self.dtype if dtype is None else as_dtype(dtype)
        if dtype == self.dtype:
            return self.clone() if copy else self
        result = apply("cast", [self], dtype=dtype)
        result._weak = self._weak and CATEGORY[dtype] == CATEGORY[self.dtype]
        return result

    def float(self): return self.to(float32)
    def double(self): return self.to(float64)
    def long(self): return self.to(int64)
    def bool(self): return self.to(bool)
    def type_as(self, other): return self.to(tensor_operand(other, "type_as").dtype)

    def detach(self) -> Tensor:
        """The same values, cut from the gradient; in-place changes to it change this tensor too,
        as they do in PyTorch, whose detach() shares storage."""
        trace, builder, (handle,) = current_handles([self])
        # (a traced backward that records its graph runs on tensors that do not require grad,
        # yet the autodiff pass differentiates its IR again: a custom Function's backward that
        # detaches a saved tensor must cut it there too)
        if trace is not None and (self.requires_grad or state.creating_graph):
            (cut,) = builder.emit("stop_gradient", [handle], {})
            # (shares the original's version, as PyTorch's: a backward that reads the alias
            # refuses an in-place change of the original after it, see Trace.changed_since)
            trace.note_view(cut, handle)
            handle = cut
        alias = Tensor._make(handle, trace, False)
        alias._base, alias._base_version = self, self._version
        if self._view_of is not None:  # PyTorch's is a view of the view's base: a copy here too
            mark_view(alias, self, self._view_of, self._view_shares_version)
        return alias

    def clone(self) -> Tensor:
        # A same-shape reshape: a fresh buffer in eager mode, and the gradient passes unchanged.
        return apply("reshape", [self], shape=self.shape)
