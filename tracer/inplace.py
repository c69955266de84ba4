"""In-place changes: how a result becomes the new value of a tensor (eagerly written into its
buffer, traced rebound to a new value), with PyTorch's checks, version counters and the gradient
rules of changes autograd does not see; and Tensor's in-place methods."""
from __future__ import annotations

import builtins
import dis
import sys

import numpy as np

from tracer.ir.vjp import CustomRule
from tracer.autograd import Node, attach
from tracer.context import is_grad_enabled, state
from tracer.dispatch import apply, as_tensor, constant
from tracer.dtypes import CATEGORY
from tracer.errors import ArgumentError, InplaceError, ShapeMismatchError, TracingError
from tracer.function_forward import before_inplace_change
from tracer.layout import broadcast_shapes_or_none, expanded
from tracer.tensor import Tensor
from tracer.tracing import escaped_error


def _keep_old_value_for(node: Node | None, tensor: Tensor) -> None:
    """Before `tensor`'s buffer is overwritten by its own in-place result, give the result's node
    a copy of the old value if its VJP reads it (PyTorch saves the original of `y` in `y.mul_(x)`)."""
    if node is None or not any(reference() is tensor for reference in node.saved):
        return
    node.inputs = [array.copy() if array is tensor._handle else array for array in node.inputs]
    node.forget(tensor)


# The rule of an in-place change made under no_grad to a tensor on the gradient path: the
# cotangent passes through unchanged to the value before the change.
STRAIGHT_THROUGH = CustomRule("no_grad_inplace", lambda builder, cotangents, needs: [cotangents[0]])
# The rule of an overwrite (fill_, zero_, copy_) recorded by autograd, operands (source, old value):
# the gradient goes to the source and zeros to the old value, so a tensor whose path was cut gets a
# zero gradient, not None (PyTorch's FillBackward and CopyBackwards).
OVERWRITE = CustomRule("inplace_overwrite", lambda builder, cotangents, needs: [
    cotangents[0], builder.zeros_like(cotangents[0])])


def _stored_back_by_subscript(frame) -> builtins.bool:
    """Whether `frame` is running an augmented assignment to a subscript: the instructions after
    its in-place operator store the result back into `t[key]` (CPython 3.11: SWAP, SWAP,
    STORE_SUBSCR; 3.12 and later: STORE_SLICE for a slice)."""
    following = [instruction.opname for instruction in dis.get_instructions(frame.f_code)
                 if instruction.offset > frame.f_lasti][:3]
    return following[-1:] in (["STORE_SUBSCR"], ["STORE_SLICE"]) and following[:2] == ["SWAP"] * 2


class InPlaceMethods:
    """Tensor's in-place methods and `.data` (given to Tensor by tracer/methods.py)."""

    @property
    def data(self) -> Tensor:
        """The same values outside autograd (as `detach()`): `w.data -= lr * w.grad` in older
        PyTorch code changes `w`."""
        return self.detach()

    @data.setter
    def data(self, value) -> None:
        if isinstance(value, Tensor) and value._base is self:
            return  # `w.data -= x` assigns back the alias it changed in place
        value = as_tensor(value)
        if (value.dtype, value.shape) != (self.dtype, self.shape):
            self._rebind_data(value)
        else:  # (a view-copy's own buffer: PyTorch's `x[0].data = v` leaves x alone too)
            alias = self.detach()
            alias._view_of = alias._view_base = None
            alias.copy_(value)

    def _rebind_data(self, value: Tensor) -> None:
        """`w.data = v` of another dtype or shape: as PyTorch's, `w` (the same object, so an
        optimizer holding it still updates it) takes `v`'s buffer, dtype and shape, unseen by
        autograd; copying into the old buffer would keep the old dtype without a word."""
        if state.trace is not None or self._trace is not None or self._base is not None:
            raise ArgumentError(
                f"`.data = ...` of a {value.dtype} tensor of shape {list(value.shape)} into a "
                f"{self.dtype} tensor of shape {list(self.shape)} can change a tensor's dtype or "
                f"shape only outside traced functions and not through a detach() alias")
        self._handle = value.detach()._eager_array("`.data = ...`")
        self._mark_changed()

    def _assign(self, result: Tensor, what: str, overwrites: builtins.bool = False) -> Tensor:
        """Make `result` the new value of this tensor, as PyTorch's in-place operations do;
        `overwrites`: the result does not depend on the old value (fill_, copy_)."""
        trace = state.trace
        if trace is not None and self._trace is None and id(self) in trace.arguments:
            trace.arguments[id(self)]._assign(result, what, overwrites)  # reached by its name
            return self
        if trace is not None and self._trace is not trace:
            raise TracingError(
                f"{what} changes a tensor in place that is not an argument of the traced function; "
                f"pass it to the traced function as an argument")
        if self._trace is not None and trace is None:
            raise escaped_error()
        if is_grad_enabled() and self.requires_grad and self.is_leaf:
            raise InplaceError(
                f"{what} changes a leaf tensor that requires grad in place; do it inside "
                f"`with tr.no_grad():` (as in an SGD update) or change a clone")
        if self._view_of is not None:
            raise InplaceError(
                f"{what} changes the result of {self._view_of} in place; here that result is a "
                f"copy, not a view, so the change would not reach the tensor it came from. Assign "
                f"into that tensor instead (x[0] = x[0] + 1), or clone() the result first")
        if trace is None and self._trace is None and not self._handle.flags.writeable:
            raise ArgumentError(f"{what} changes in place a tensor whose numpy buffer is read-only")
        if CATEGORY[result.dtype] > CATEGORY[self.dtype]:
            raise ArgumentError(f"{what}: a {result.dtype} result cannot be written in place into "
                                f"a {self.dtype} tensor")
        result = result.to(self.dtype)
        if result.shape != self.shape:
            if broadcast_shapes_or_none(result.shape, self.shape) != self.shape:
                raise ShapeMismatchError(f"{what}: a result of shape {list(result.shape)} cannot be "
                                         f"written in place into a tensor of shape {list(self.shape)}")
            result = result.expand(*self.shape)
        if overwrites and is_grad_enabled() and (self.requires_grad or result.requires_grad):
            result = apply("custom_vjp", [result, result, self], num_outputs=1, rule=OVERWRITE)
        before_inplace_change(self)
        if self._base is not None:
            before_inplace_change(self._base)
            self._base._assign_data(result, what)
        if trace is None:
            _keep_old_value_for(result._node, self)
            np.copyto(self._handle, result._handle)
        elif not is_grad_enabled() and self.requires_grad and not self.is_leaf:
            # Unseen by autograd (as in PyTorch): the new value, the old value's gradient path.
            (value,) = trace.builder.emit(
                "custom_vjp", [result._handle, self._handle],
                {"num_outputs": 1, "rule": STRAIGHT_THROUGH})
            trace.rebind(self, value, result._handle)
        else:
            trace.rebind(self, result._handle, result._handle)
        if result.requires_grad:
            attach(self, result._node, result._output_index)
        self._mark_changed()
        return self

    def _assign_data(self, result: Tensor, what: str) -> None:
        """An in-place change made through `.data`: unseen by autograd."""
        if state.trace is not None:
            value = expanded(result.to(self.dtype), self.shape)._handle
            if self.requires_grad:
                (value,) = state.trace.builder.emit("stop_gradient", [value], {})
            # a change as eager mode's: a backward that reads the old value refuses it, and a
            # leaf's gradient still reaches the uses of its old value
            state.trace.rebind(self, value, value)
        self._mark_changed()  # eagerly, the shared buffer was written by the alias

    def __iadd__(self, other): return self._augmented(other, Tensor.add, Tensor.add_)
    def __isub__(self, other): return self._augmented(other, Tensor.sub, Tensor.sub_)
    def __imul__(self, other): return self._augmented(other, Tensor.mul, Tensor.mul_)
    def __itruediv__(self, other): return self._augmented(other, Tensor.div, Tensor.div_)

    def _augmented(self, other, out_of_place, in_place) -> Tensor:
        """`x op= other`. In `t[key] op= other`, `x` is the copy `t[key]` gives here, and Python
        then stores the result with `t[key] = result`: computed out of place, the result reaches
        `t` through that store, as PyTorch's in-place change of its view does (`x[:, 0] += 1`, a
        common idiom, was refused). Elsewhere the in-place method, which refuses to change such a
        copy (`v = t[1:3]; v += 1` would change `t` in PyTorch)."""
        if self._view_of == "indexing" and _stored_back_by_subscript(sys._getframe(2)):
            result = out_of_place(self, other)
            if CATEGORY[result.dtype] > CATEGORY[self.dtype]:  # (`i[0] /= 2` of ints, as in_place)
                raise ArgumentError(f"{in_place.__name__}: a {result.dtype} result cannot be "
                                    f"written in place into a {self.dtype} tensor")
            return result.to(self.dtype)
        return in_place(self, other)

    def add_(self, other, alpha=1): return self._assign(self.add(other, alpha=alpha), "add_")
    def sub_(self, other, alpha=1): return self._assign(self.sub(other, alpha=alpha), "sub_")
    def mul_(self, other): return self._assign(self * other, "mul_")
    def pow_(self, other): return self._assign(self ** other, "pow_")
    def neg_(self): return self._assign(-self, "neg_")
    def abs_(self): return self._assign(self.abs(), "abs_")
    def exp_(self): return self._assign(self.exp(), "exp_")
    def relu_(self): return self._assign(self.relu(), "relu_")
    def clamp_(self, min=None, max=None): return self._assign(self.clamp(min, max), "clamp_")

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def fill_(self, value) -> Tensor:
        value = value if isinstance(value, Tensor) else constant(value, self.dtype)
        return self._assign(expanded(value, self.shape), "fill_", overwrites=True)

    def copy_(self, source) -> Tensor:
        return self._assign(as_tensor(source), "copy_", overwrites=True)
