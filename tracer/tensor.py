"""The Tensor: one API over two kinds of handle.

In eager mode a Tensor holds a numpy array and operations run the reference semantics at once,
recording a tape for backward. Inside `@trace` it holds an `ir.Value` and operations append
primitives to the trace's graph. Every operation below goes through `apply`, which is the only place
that knows the difference.
"""
from __future__ import annotations

import builtins
import functools
import numbers
import weakref
from collections import namedtuple
from typing import Any, Sequence

import numpy as np

from tracer.ir import types as irtypes
from tracer.ir.builder import normalize_attributes
from tracer.ir.primitives import (NON_DIFFERENTIABLE, IndexRangeError, ShapeError,
                                  broadcast_shapes)
from tracer.ir.vjp import CustomRule
from tracer.autograd import ARRAYS, Node, run_backward
from tracer.context import is_grad_enabled, state
from tracer.errors import (ArgumentError, IndexOutOfRangeError, InplaceError, ShapeMismatchError,
                           SpecializationNeeded, TracingError, user_line)
from tracer.tracing import escaped_error

float32, float64, int64, bool = irtypes.float32, irtypes.float64, irtypes.int64, irtypes.bool_

_CATEGORY = {irtypes.bool_: 0, irtypes.int64: 1, irtypes.float32: 2, irtypes.float64: 2}
_DEFAULT_OF_CATEGORY = {0: irtypes.bool_, 1: irtypes.int64, 2: irtypes.float32}
_WEAK_OF_CATEGORY = {0: irtypes.bool_, 1: irtypes.int64, 2: irtypes.float64}
# Primitives whose numpy result can be a view of an operand: eager mode copies it, because every
# eager tensor owns its buffer (in-place changes never reach another tensor).
_VIEWING = frozenset({"broadcast", "reshape", "transpose", "slice", "stop_gradient", "custom_vjp",
                      "iota"})

MaxResult = namedtuple("MaxResult", ["values", "indices"])


def as_dtype(dtype) -> np.dtype:
    """The dtype for `dtype`, or an ArgumentError naming the supported ones."""
    try:
        return irtypes.as_dtype(dtype)
    except TypeError as error:
        raise ArgumentError(str(error)) from None


def _python_scalar_category(value) -> int:
    if isinstance(value, (builtins.bool, np.bool_)):
        return 0
    if isinstance(value, numbers.Integral):
        return 1
    if isinstance(value, numbers.Real):
        return 2
    raise ArgumentError(f"expected a Tensor or a number, got {type(value).__name__}")


def _is_scalar(value) -> builtins.bool:
    return isinstance(value, numbers.Number) and not isinstance(value, Tensor)


def result_dtype(*operands) -> np.dtype:
    """PyTorch's promotion: a Python number (or a weak traced scalar) does not widen a tensor of
    its own category (float32 * 2.0 stays float32), but lifts one of a lower category."""
    tensors = [o for o in operands if isinstance(o, Tensor) and not o._weak]
    weak = [_CATEGORY[o.dtype] if isinstance(o, Tensor) else _python_scalar_category(o)
            for o in operands if not isinstance(o, Tensor) or o._weak]
    weak_category = max(weak, default=-1)

    def widest(dtypes):
        return max(dtypes, key=lambda d: (_CATEGORY[d], d.itemsize), default=None)

    # As PyTorch: tensors with dimensions decide; a 0-d tensor only when it is of a higher
    # category, and a Python number only when it is of a higher category than both.
    best = widest([t.dtype for t in tensors if t.ndim])
    scalar_best = widest([t.dtype for t in tensors if not t.ndim])
    if best is None or (scalar_best is not None and _CATEGORY[scalar_best] > _CATEGORY[best]):
        best = scalar_best
    if best is None:
        return _WEAK_OF_CATEGORY[weak_category]
    if weak_category > _CATEGORY[best]:
        return _DEFAULT_OF_CATEGORY[weak_category]
    return best


def _current_handles(tensors: Sequence["Tensor"]):
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


def apply(primitive: str, inputs: Sequence["Tensor"], **attributes: Any) -> "Tensor":
    """Run (eager) or record (traced) one primitive on tensors; the single door to both modes."""
    trace, builder, handles = _current_handles(inputs)
    attributes = normalize_attributes(attributes)
    try:
        (result,) = builder.emit(primitive, handles, attributes)
    except ShapeError as error:
        raise ShapeMismatchError(str(error)) from None
    except IndexRangeError as error:  # eager gather or scatter at an index outside its dimension
        raise IndexOutOfRangeError(str(error)) from None
    differentiable = (primitive not in NON_DIFFERENTIABLE and irtypes.is_float(result.dtype))
    inputs_require_grad = any(t.requires_grad for t in inputs)
    requires_grad = is_grad_enabled() and differentiable and inputs_require_grad
    if trace is not None:
        if inputs_require_grad and differentiable and not requires_grad:
            # Recorded under no_grad: the autodiff pass must not differentiate through it.
            (result,) = builder.emit("stop_gradient", [result], {})
        return Tensor._make(result, trace, requires_grad)
    if primitive in _VIEWING and (result.base is not None or not result.flags.writeable):
        result = result.copy()
    node = Node(primitive, attributes, inputs, handles, [result]) if requires_grad else None
    output = Tensor._make(result, None, requires_grad, node)
    if node is not None:
        node.save_outputs([output])
    return output


def _keep_old_value_for(node: Node | None, tensor: "Tensor") -> None:
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


def constant(value, dtype) -> "Tensor":
    return apply("constant", [], value=as_dtype(dtype).type(value).item(), dtype=dtype)


def as_tensor(value, dtype=None, accept_data: builtins.bool = False) -> "Tensor":
    """`value` as a Tensor: Tensors pass through, numbers become (weak) constants. Lists and
    arrays only where PyTorch takes them too (`accept_data`: `x[0] = [1, 2]`); an operand of an
    operation must be a Tensor, as in PyTorch."""
    if isinstance(value, Tensor):
        return value if dtype is None else value.to(dtype)
    if _is_scalar(value):
        result = constant(value, dtype or _WEAK_OF_CATEGORY[_python_scalar_category(value)])
        result._weak = dtype is None
        return result
    if accept_data and isinstance(value, (np.ndarray, list, tuple)):
        return tensor(value, dtype=dtype)
    if isinstance(value, (np.ndarray, list, tuple)):
        raise ArgumentError(f"expected a Tensor or a number, got a {type(value).__name__}; wrap "
                            f"it in tr.tensor(...)")
    raise ArgumentError(f"expected a Tensor or a number, got {type(value).__name__}")


def promote(*operands) -> list["Tensor"]:
    dtype = result_dtype(*operands)
    weak = all(_is_scalar(o) or o._weak for o in operands)
    results = []
    for operand in operands:
        t = as_tensor(operand, dtype) if _is_scalar(operand) else operand.to(dtype)
        t._weak = weak
        results.append(t)
    return results


def binary(primitive: str, x, y) -> "Tensor":
    x, y = promote(x, y)
    result = apply(primitive, [x, y])
    result._weak = x._weak and y._weak and result.dtype == x.dtype
    return result


def _to_float(x: "Tensor") -> "Tensor":
    return x if irtypes.is_float(x.dtype) else x.to(float64 if x._weak else float32)


def _float_binary(primitive: str, x, y) -> "Tensor":
    x, y = promote(x, y)
    weak = x._weak
    result = apply(primitive, [_to_float(x), _to_float(y)])
    result._weak = weak
    return result


def _normalize_dim(dim: int, ndim: int) -> int:
    limit = builtins.max(ndim, 1)
    if not -limit <= dim < limit:
        raise ShapeMismatchError(f"dimension {dim} is out of range for a tensor of {ndim} dimensions")
    return dim % limit


def _number_argument(value):
    """`value`, unless it is a Python number passed to the traced function: then its value is
    needed, and the function traces again with the int argument static (a float one is an
    error naming it)."""
    if isinstance(value, Tensor) and value._weak and value._trace is not None:
        value._eager_array("a size, an index or a dimension")
    return value


def _as_dim(dim) -> int:
    dim = _number_argument(dim)
    if isinstance(dim, (builtins.bool, np.bool_)) or not isinstance(dim, numbers.Integral):
        raise ArgumentError(f"a dimension is an int, got {type(dim).__name__}")
    return int(dim)


def _normalize_dims(dim, ndim: int) -> tuple[int, ...]:
    """Sorted non-negative dimensions; a 0-d tensor's only dimension (0 or -1) reduces nothing."""
    if dim is None:
        return tuple(range(ndim))
    dims = [dim] if not isinstance(dim, (tuple, list)) else list(dim)
    normalized = [_normalize_dim(_as_dim(d), ndim) for d in dims]
    if len(set(normalized)) != len(normalized):
        raise ArgumentError(f"dimension list {list(dims)} names a dimension twice")
    return tuple(sorted(normalized)) if ndim else ()


def _dim_or_axis(dim, axis):
    """PyTorch accepts numpy's `axis=` for `dim=`."""
    if axis is not None and dim is not None:
        raise ArgumentError("pass dim= or axis=, not both")
    return dim if axis is None else axis


def _shape_arguments(shape) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    shape = [_number_argument(d) for d in shape]
    for d in shape:
        if not isinstance(d, (int, np.integer)) or isinstance(d, builtins.bool):
            raise ArgumentError(f"a shape holds ints, got {type(d).__name__}")
        if d < -1:
            raise ArgumentError(f"invalid shape dimension {d}")
    return tuple(int(d) for d in shape)


def where(condition, x, y) -> "Tensor":
    """Elementwise `x` where `condition` holds, else `y` (broadcast together)."""
    condition = as_tensor(condition)
    if condition.dtype != bool:
        raise ArgumentError(f"where needs a bool condition, got {condition.dtype}")
    x, y = promote(x, y)
    if x._weak and condition.ndim:  # Python numbers on both sides: a tensor of the default dtype
        dtype = _DEFAULT_OF_CATEGORY[_CATEGORY[x.dtype]]
        x, y = x.to(dtype), y.to(dtype)
    result = apply("select", [condition, x, y])
    result._weak = x._weak
    return result


def _tensor_operand(value, method: str) -> "Tensor":
    """A method that reads only an operand's shape or dtype still takes only a Tensor (PyTorch)."""
    if not isinstance(value, Tensor):
        raise ArgumentError(f"{method}() takes a Tensor, got a {type(value).__name__}; wrap it in "
                            f"tr.tensor(...)")
    return value


def _scaled(other, alpha):
    """`other * alpha` for add/sub; `alpha` may be a traced Python number (a runtime input), whose
    value is unknown while tracing, so only a literal 1 is skipped."""
    if isinstance(alpha, numbers.Number) and not isinstance(alpha, Tensor) and alpha == 1:
        return other
    return as_tensor(other) * alpha


def _same_weakness(result: "Tensor", operand: "Tensor") -> "Tensor":
    """-s and abs(s) of a Python number passed to a traced function are Python numbers in eager
    mode: they stay weak (they do not widen a float32 tensor)."""
    result._weak = operand._weak
    return result


def mark_view(result: "Tensor", base: "Tensor", what: str) -> "Tensor":
    """Mark what a PyTorch view operation returns: here it is a copy. An in-place change to it is
    refused (it could not reach the tensor it came from), and so is reading it after its base was
    changed in place (a PyTorch view would show the change): never a silently stale value."""
    root = base if base._view_base is None else base._view_base
    result._view_of = what
    # A reference, not a weak one, as a PyTorch view keeps its base alive: the check must still
    # see the in-place change after the caller dropped the base.
    result._view_base = root
    result._view_version = root._version
    return result


def check_current(tensor: "Tensor") -> None:
    """Raise if `tensor` is a view-copy whose base has been changed in place since it was taken."""
    base = tensor._view_base
    if base is not None and base._version != tensor._view_version:
        raise InplaceError(
            f"this tensor is the result of {tensor._view_of}, a copy here, taken before the tensor "
            f"it came from was changed in place at {base._changed_at}; a PyTorch view would show "
            f"the change. Take it again after the change (or clone() it before, to keep the old "
            f"values)")


def _view_operation(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        if result is not self:
            mark_view(result, self, f"{method.__name__}()")
        return result
    wrapper.__doc__ = (method.__doc__ or "") + " (A copy here: see mark_view.)"
    return wrapper


def _number_indices(key):
    """`key`, checked for number arguments of a traced function (see _number_argument)."""
    if isinstance(key, tuple):
        return tuple(_number_argument(k) for k in key)
    return _number_argument(key)


def _fresh(tensor: "Tensor") -> "Tensor":
    """A result computed by this module that merely used a view operation on the way."""
    tensor._view_of = tensor._view_base = None
    return tensor


class Tensor:
    """A tensor with PyTorch's API; see the module docstring for the two modes."""

    __slots__ = ("_handle", "_trace", "_requires_grad", "_node", "_output_index", "_grad", "_base",
                 "_view_of", "_view_base", "_view_version", "_base_version",
                 "_version", "_changed_at", "_saved_by", "_weak", "_leaf", "_accumulator",
                 "__weakref__")
    __array_priority__ = 1000  # numpy defers `array * tensor` to Tensor.__rmul__
    __hash__ = object.__hash__

    @classmethod
    def _make(cls, handle, trace, requires_grad: builtins.bool, node: Node | None = None,
              output_index: int = 0, leaf: builtins.bool | None = None) -> "Tensor":
        self = object.__new__(cls)
        self._handle = handle
        self._trace = trace
        self._requires_grad = requires_grad
        self._node = node
        self._output_index = output_index
        self._grad = None
        self._version = 0
        self._changed_at = None
        self._saved_by: list = []  # weak references to the tape nodes that saved this tensor
        self._weak = False
        self._leaf = (not requires_grad) if leaf is None else leaf
        self._accumulator = None
        self._base = None  # the tensor this detaches: in-place changes go through to it
        self._base_version = 0  # traced: the base's version this alias's value was taken at
        self._view_of = None  # the view operation (a copy here) this tensor is the result of
        self._view_base = None  # the tensor it is a view-copy of (kept alive, as PyTorch does)
        self._view_version = 0  # that tensor's version when the copy was taken
        if trace is not None and requires_grad and self._leaf:
            trace.leaves.append(self)
        return self

    def __init__(self, *args, **kwargs):
        raise TypeError("create tensors with tr.tensor(data), tr.from_numpy(a), tr.zeros(...), ...")

    # Properties ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._handle.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._handle.dtype

    @property
    def ndim(self) -> int:
        return len(self._handle.shape)

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[_normalize_dim(dim, self.ndim)]

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def requires_grad(self) -> builtins.bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: builtins.bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: builtins.bool = True) -> "Tensor":
        if not self.is_leaf and requires_grad:
            return self  # already requires grad (as PyTorch)
        if not self.is_leaf:
            raise ArgumentError("requires_grad can only be changed on leaf tensors; "
                                "use .detach() to make a new leaf")
        if requires_grad and not irtypes.is_float(self.dtype):
            raise ArgumentError(f"only float tensors can require gradients, this one is {self.dtype}")
        self._requires_grad = builtins.bool(requires_grad)
        self._leaf = True
        if self._trace is not None and requires_grad and not any(t is self for t in self._trace.leaves):
            self._trace.leaves.append(self)
        return self

    @property
    def grad(self) -> "Tensor | None":
        trace = state.trace
        if trace is not None and self._trace is None:  # reached from outside the traced function
            return trace.grad_of(self)
        return self._grad

    @grad.setter
    def grad(self, value: "Tensor | None") -> None:
        trace = state.trace
        if trace is not None and self._trace is None:
            trace.set_grad(self, value)
        else:
            self._grad = value

    @property
    def is_leaf(self) -> builtins.bool:
        return self._leaf or not self._requires_grad

    @property
    def grad_fn(self):
        return self._node

    # Reading values -----------------------------------------------------------------------------
    def _eager_array(self, what: str) -> np.ndarray:
        check_current(self)
        # (`@trace` makes the int arguments a value comes from static, when it comes from them
        # alone: see runtime/recording.py)
        if self._trace is not None and self._weak:
            raise SpecializationNeeded(
                f"{what} needs the value of a Python number passed to the traced function, which "
                f"is a runtime input; name its position in tr.trace(f, static_argnums=...) to "
                f"bake it in (one compilation per value)", self._handle, what)
        if self._trace is not None:
            raise SpecializationNeeded(
                f"{what} needs the value of a traced tensor, which is only known when the compiled "
                f"function runs; return the tensor from the traced function and read it outside, "
                f"or use tr.where(...) instead of Python control flow on its value", self._handle,
                what)
        return self._handle

    def numpy(self) -> np.ndarray:
        array = self._eager_array(".numpy()")
        if self.requires_grad:
            raise ArgumentError("can't call numpy() on a tensor that requires grad; "
                                "use tensor.detach().numpy()")
        return array

    def __array__(self, dtype=None, copy=None):
        """numpy's protocol: the tensor's own buffer unless `copy=True` or another dtype is asked
        for (which copies, so `copy=False` then raises ValueError, as numpy requires)."""
        array = self._eager_array("np.asarray(tensor)")
        if dtype is not None and np.dtype(dtype) != array.dtype:
            if copy is False:
                raise ValueError(f"np.asarray(tensor, dtype={np.dtype(dtype)}, copy=False) would "
                                 f"need a copy: the tensor is {array.dtype}")
            return array.astype(dtype)
        return array.copy() if copy else array

    def __dlpack__(self, **options):
        """DLPack export (`torch.from_dlpack(t)`, `np.from_dlpack(t)`): shares the buffer. The
        options (stream, max_version, dl_device, copy) are numpy's, which does the export."""
        array = self._eager_array("__dlpack__")
        if self.requires_grad:
            raise ArgumentError("can't export a tensor that requires grad through DLPack; "
                                "use tensor.detach()")
        return array.__dlpack__(**options)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._eager_array("__dlpack_device__").__dlpack_device__()

    def item(self):
        array = self._eager_array(".item()")
        if array.size != 1:
            raise ArgumentError(f"item() needs a tensor with one element, this one has {array.size}")
        return array.reshape(()).item()

    def tolist(self):
        return self._eager_array(".tolist()").tolist()

    def __bool__(self) -> builtins.bool:
        array = self._eager_array("bool(tensor) (Python control flow on a tensor)")
        if array.size != 1:
            raise ArgumentError(f"the truth value of a tensor with {array.size} elements is "
                                f"ambiguous; use .any() or .all() on a comparison")
        return builtins.bool(array.reshape(-1)[0])

    def __float__(self) -> float:
        self._eager_array("float(tensor)")
        return float(self.item())

    def __int__(self) -> int:
        self._eager_array("int(tensor)")
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype != int64:
            raise ArgumentError("only integer tensors can be used as an index")
        return int(self)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise ArgumentError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        suffix = ", requires_grad=True" if self.requires_grad else ""
        if self._trace is not None:
            return f"Tensor(traced %{self._handle.name}: {self._handle.type}{suffix})"
        check_current(self)
        body = np.array2string(self._handle, separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{suffix})"

    # Autograd -----------------------------------------------------------------------------------
    def backward(self, gradient=None, retain_graph: builtins.bool = False) -> None:
        """Accumulate the gradient of this tensor into the `.grad` of the leaves it depends on."""
        if not self.requires_grad:
            raise ArgumentError("backward() on a tensor that does not require grad (no input "
                                "requires grad, or it was computed under no_grad)")
        if gradient is None:
            if self.numel() != 1:
                raise ArgumentError(f"backward() without a gradient needs a one-element tensor, "
                                    f"this one has shape {list(self.shape)}; pass gradient=")
            gradient = ones(*self.shape, dtype=self.dtype)
        gradient = as_tensor(gradient).to(self.dtype)
        if gradient.shape != self.shape:
            raise ShapeMismatchError(f"backward(gradient=...) of shape {list(gradient.shape)} for "
                                     f"a tensor of shape {list(self.shape)}")
        if self._trace is not None:
            from tracer.transforms import traced_backward
            traced_backward(self, gradient)
            return
        run_backward([(self, gradient._eager_array("backward"))], retain_graph=retain_graph)

    @property
    def data(self) -> "Tensor":
        """The same values outside autograd (as `detach()`): `w.data -= lr * w.grad` in older
        PyTorch code changes `w`."""
        return self.detach()

    @data.setter
    def data(self, value) -> None:
        if isinstance(value, Tensor) and value._base is self:
            return  # `w.data -= x` assigns back the alias it changed in place
        self.detach().copy_(value)

    def detach(self) -> "Tensor":
        """The same values, cut from the gradient; in-place changes to it change this tensor too,
        as they do in PyTorch, whose detach() shares storage."""
        trace, builder, (handle,) = _current_handles([self])
        if trace is not None and self.requires_grad:
            (handle,) = builder.emit("stop_gradient", [handle], {})
        alias = Tensor._make(handle, trace, False)
        alias._base, alias._base_version = self, self._version
        return alias

    def _follow_base(self, trace) -> None:
        """Traced, a detach() alias is a value of its own: after an in-place change of its base it
        takes the base's new value (eagerly the two share one buffer, as in PyTorch)."""
        base = self._base
        if base._version == self._base_version:
            return
        handle = trace.handle_of(base)
        if base.requires_grad:
            (handle,) = trace.builder.emit("stop_gradient", [handle], {})
        self._handle, self._base_version = handle, base._version

    def detach_(self) -> "Tensor":
        self._requires_grad, self._node, self._leaf = False, None, True
        return self

    def clone(self) -> "Tensor":
        # A same-shape reshape: a fresh buffer in eager mode, and the gradient passes unchanged.
        return apply("reshape", [self], shape=self.shape)

    # In-place machinery ------------------------------------------------------------------------
    def _assign(self, result: "Tensor", what: str, overwrites: builtins.bool = False) -> "Tensor":
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
        if _CATEGORY[result.dtype] > _CATEGORY[self.dtype]:
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
        if self._base is not None:
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
            self._node, self._output_index = result._node, result._output_index
            self._requires_grad, self._leaf = True, False
        self._mark_changed()
        return self

    def _mark_changed(self) -> None:
        """Count an in-place change: a newer version, where it happened, and word to every tape
        node that saved this tensor for its backward (which may run after the tensor is gone)."""
        self._version += 1
        self._changed_at = user_line()
        for reference in self._saved_by:
            node = reference()
            if node is not None:
                node.note_change(self)

    def _assign_data(self, result: "Tensor", what: str) -> None:
        """An in-place change made through `.data`: unseen by autograd."""
        if state.trace is not None:
            value = result.to(self.dtype).expand(*self.shape)._handle
            if self.requires_grad:
                (value,) = state.trace.builder.emit("stop_gradient", [value], {})
            self._handle = value
        self._mark_changed()  # eagerly, the shared buffer was written by the alias

    def __iadd__(self, other): return self.add_(other)
    def __isub__(self, other): return self.sub_(other)
    def __imul__(self, other): return self.mul_(other)
    def __itruediv__(self, other): return self.div_(other)

    def add_(self, other, alpha=1): return self._assign(self.add(other, alpha=alpha), "add_")
    def sub_(self, other, alpha=1): return self._assign(self.sub(other, alpha=alpha), "sub_")
    def mul_(self, other): return self._assign(self * other, "mul_")
    def div_(self, other): return self._assign(self / other, "div_")
    def pow_(self, other): return self._assign(self ** other, "pow_")
    def neg_(self): return self._assign(-self, "neg_")
    def abs_(self): return self._assign(self.abs(), "abs_")
    def exp_(self): return self._assign(self.exp(), "exp_")
    def relu_(self): return self._assign(self.relu(), "relu_")
    def clamp_(self, min=None, max=None): return self._assign(self.clamp(min, max), "clamp_")

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def fill_(self, value) -> "Tensor":
        value = value if isinstance(value, Tensor) else constant(value, self.dtype)
        return self._assign(value.expand(*self.shape), "fill_", overwrites=True)

    def copy_(self, source) -> "Tensor":
        return self._assign(as_tensor(source), "copy_", overwrites=True)

    def __setitem__(self, key, value) -> None:
        from tracer.indexing import setitem
        self._assign(setitem(self, _number_indices(key), value), "index assignment")

    def __getitem__(self, key) -> "Tensor":
        from tracer.indexing import getitem
        return getitem(self, _number_indices(key))

    # Index operations (tracer/gathering.py) -------------------------------------------------------
    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        from tracer.gathering import index_select
        return index_select(self, dim, index)

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        from tracer.gathering import gather
        return gather(self, dim, index)

    def take_along_dim(self, indices: "Tensor", dim: int | None = None) -> "Tensor":
        from tracer.gathering import take_along_dim
        return take_along_dim(self, indices, dim)

    def index_add(self, dim: int, index: "Tensor", source, alpha=1) -> "Tensor":
        from tracer.gathering import index_add
        return index_add(self, dim, index, source, alpha)

    def index_add_(self, dim: int, index: "Tensor", source, alpha=1) -> "Tensor":
        return self._assign(self.index_add(dim, index, source, alpha), "index_add_")

    # Conversions --------------------------------------------------------------------------------
    def to(self, dtype) -> "Tensor":
        dtype = as_dtype(dtype)
        if dtype == self.dtype:
            return self
        result = apply("cast", [self], dtype=dtype)
        result._weak = self._weak and _CATEGORY[dtype] == _CATEGORY[self.dtype]
        return result

    def float(self): return self.to(float32)
    def double(self): return self.to(float64)
    def long(self): return self.to(int64)
    def bool(self): return self.to(bool)
    def type_as(self, other): return self.to(_tensor_operand(other, "type_as").dtype)

    # Arithmetic ---------------------------------------------------------------------------------
    def __add__(self, other): return binary("add", self, other)
    def __radd__(self, other): return binary("add", other, self)
    def __sub__(self, other): return binary("sub", self, other)
    def __rsub__(self, other): return binary("sub", other, self)
    def __mul__(self, other): return binary("mul", self, other)
    def __rmul__(self, other): return binary("mul", other, self)
    def __truediv__(self, other): return _float_binary("div", self, other)
    def __rtruediv__(self, other): return _float_binary("div", other, self)
    def __neg__(self): return _same_weakness(apply("neg", [self]), self)
    def __pos__(self): return self
    def __abs__(self): return self.abs()

    def __pow__(self, exponent):
        if (isinstance(exponent, numbers.Integral) and exponent < 0
                and not irtypes.is_float(self.dtype)):
            raise ArgumentError("integers to negative integer powers are not allowed; use a float "
                                "tensor or exponent")
        if _is_scalar(exponent) and not irtypes.is_float(self.dtype) and not isinstance(exponent, int):
            return _float_binary("pow", self, exponent)
        return binary("pow", self, exponent)

    def __rpow__(self, base):
        return binary("pow", base, self)

    def __matmul__(self, other): return self.matmul(other)
    def __rmatmul__(self, other): return as_tensor(other).matmul(self)

    def add(self, other, alpha=1):
        return self + _scaled(other, alpha)

    def sub(self, other, alpha=1):
        return self - _scaled(other, alpha)

    def mul(self, other): return self * other
    def div(self, other): return self / other
    def pow(self, exponent): return self ** exponent
    def neg(self): return -self

    # Comparisons and logic.
    def __lt__(self, other): return binary("lt", self, other)
    def __le__(self, other): return binary("le", self, other)
    def __gt__(self, other): return binary("gt", self, other)
    def __ge__(self, other): return binary("ge", self, other)
    def __eq__(self, other): return binary("eq", self, other)
    def __ne__(self, other): return binary("ne", self, other)
    lt, le, gt, ge, eq, ne = __lt__, __le__, __gt__, __ge__, __eq__, __ne__

    def _logical(self, primitive, other):
        if self.dtype != bool or as_tensor(other).dtype != bool:
            raise ArgumentError(f"&, | and ~ are defined on bool tensors here, got {self.dtype}")
        return apply(primitive, [self, as_tensor(other)])

    def __and__(self, other): return self._logical("logical_and", other)
    def __or__(self, other): return self._logical("logical_or", other)
    __rand__, __ror__ = __and__, __or__

    def __invert__(self):
        if self.dtype != bool:
            raise ArgumentError(f"~ is defined on bool tensors here, got {self.dtype}")
        return apply("logical_not", [self])

    logical_not = __invert__

    # Elementwise functions.
    def _unary_float(self, primitive):
        return apply(primitive, [_to_float(self)])

    def abs(self): return _same_weakness(apply("abs", [self]), self)
    def sign(self): return apply("sign", [self])
    def exp(self): return self._unary_float("exp")
    def log(self): return self._unary_float("log")
    def sqrt(self): return self._unary_float("sqrt")
    def tanh(self): return self._unary_float("tanh")
    def sin(self): return self._unary_float("sin")
    def cos(self): return self._unary_float("cos")

    def sigmoid(self):
        return 1.0 / (1.0 + (-_to_float(self)).exp())

    def relu(self):
        # As PyTorch (threshold_backward): no gradient where x <= 0, so nan passes it; nan stays nan
        return where(self <= 0, 0, self)

    def clamp(self, min=None, max=None) -> "Tensor":
        if min is None and max is None:
            raise ArgumentError("clamp needs at least one of min= and max=")
        # As PyTorch: the value is min(max(x, min), max) (nan stays nan), and the gradient passes
        # only where min <= x <= max (not at nan, nor anywhere when min > max).
        differentiable = is_grad_enabled() and self.requires_grad
        value = self.detach() if differentiable else self
        if min is not None:
            value = where(value < min, as_tensor(min, result_dtype(self, min)), value)
        if max is not None:
            value = where(value > max, as_tensor(max, result_dtype(value, max)), value)
        if not differentiable:
            return value
        inside = (self >= min) if max is None else (self <= max) if min is None else (
            (self >= min) & (self <= max))
        return where(inside, self, value)

    clip = clamp

    def maximum(self, other): return binary("maximum", self, other)
    def minimum(self, other): return binary("minimum", self, other)

    # Reductions ---------------------------------------------------------------------------------
    def sum(self, dim=None, keepdim: builtins.bool = False, *, axis=None) -> "Tensor":
        dim = _dim_or_axis(dim, axis)
        x = self.to(int64) if self.dtype == bool else self
        axes = _normalize_dims(dim, x.ndim)
        # A sum over no axis (of a 0-d tensor) is still a new tensor, not `x` itself.
        result = apply("reduce_sum", [x], axes=axes) if axes else x.clone()
        return result._keep(axes, self.shape) if keepdim else result

    def _keep(self, axes, shape) -> "Tensor":
        return _fresh(self.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape))))

    def any(self, dim=None, keepdim: builtins.bool = False) -> "Tensor":
        return (self != 0).to(int64).sum(dim, keepdim) > 0

    def all(self, dim=None, keepdim: builtins.bool = False) -> "Tensor":
        return (self == 0).to(int64).sum(dim, keepdim) == 0

    def mean(self, dim=None, keepdim: builtins.bool = False, *, axis=None) -> "Tensor":
        dim = _dim_or_axis(dim, axis)
        if not irtypes.is_float(self.dtype):
            raise ArgumentError(f"mean needs a float tensor, got {self.dtype}; use .float() first")
        axes = _normalize_dims(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        return self.sum(dim=axes, keepdim=keepdim) / count

    def max(self, dim=None, keepdim: builtins.bool = False):
        """The maximum; with `dim`, a (values, indices) pair as in PyTorch; with a tensor,
        the elementwise maximum."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        return self._extremum("reduce_max", dim, keepdim)

    def min(self, dim=None, keepdim: builtins.bool = False):
        """The minimum; with `dim`, a (values, indices) pair as in PyTorch."""
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        return self._extremum("reduce_min", dim, keepdim)

    def _extremum(self, reduction: str, dim, keepdim: builtins.bool):
        if dim is None:
            return apply(reduction, [self], axes=tuple(range(self.ndim)))
        axis = _normalize_dim(_as_dim(dim), self.ndim)
        if self.ndim == 0:
            return MaxResult(self, zeros((), dtype=int64))
        kept = apply(reduction, [self], axes=(axis,))._keep((axis,), self.shape)
        hit = self == kept
        if irtypes.is_float(self.dtype):
            hit = hit | (self != self)  # a nan is the extremum, as in PyTorch
        # The first index holding it: the largest (size - 1 - index) among the hits.
        size = self.shape[axis]
        position = iota(self.shape, axis)
        candidates = where(hit, position * -1 + (size - 1), -1)
        indices = (size - 1) - apply("reduce_max", [candidates], axes=(axis,)).detach()
        # The value at that index, so that (as in PyTorch) its gradient goes there alone.
        chosen = position == indices._keep((axis,), self.shape)
        values = where(chosen, self, 0).sum(axis)
        if keepdim:
            values, indices = values._keep((axis,), self.shape), indices._keep((axis,), self.shape)
        return MaxResult(values, indices)

    def argmax(self, dim=None, keepdim: builtins.bool = False):
        if dim is None:
            return self.reshape(-1).max(0).indices
        return self.max(dim, keepdim).indices

    def _shifted_down(self, dim: int) -> "Tensor":
        """self minus its maximum along `dim`: the same softmax, and exp cannot overflow. Without
        elements there is nothing to shift (and no maximum along an empty `dim`)."""
        if self.numel() == 0:
            return self
        return self - self.max(dim, keepdim=True).values.detach()

    def softmax(self, dim: int) -> "Tensor":
        exponentials = self._shifted_down(dim).exp()
        return exponentials / exponentials.sum(dim, keepdim=True)

    def log_softmax(self, dim: int) -> "Tensor":
        shifted = self._shifted_down(dim)
        return shifted - shifted.exp().sum(dim, keepdim=True).log()

    # Layout -------------------------------------------------------------------------------------
    @_view_operation
    def reshape(self, *shape) -> "Tensor":
        shape = list(_shape_arguments(shape))
        if shape.count(-1) > 1:
            raise ShapeMismatchError("reshape: only one dimension can be -1")
        if -1 in shape:
            known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
            if known == 0 or self.numel() % known:
                raise ShapeMismatchError(f"cannot reshape {list(self.shape)} to {shape}")
            shape[shape.index(-1)] = self.numel() // known
        if tuple(shape) == self.shape:
            return self
        return apply("reshape", [self], shape=tuple(shape))

    view = reshape

    @_view_operation
    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    @_view_operation
    def permute(self, *dims) -> "Tensor":
        dims = _shape_arguments(dims)
        if len(dims) != self.ndim:
            raise ShapeMismatchError(f"permute needs {self.ndim} dimensions, got {list(dims)}")
        return apply("transpose", [self], permutation=[_normalize_dim(d, self.ndim) for d in dims])

    @_view_operation
    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        order = list(range(self.ndim))
        a, b = _normalize_dim(dim0, self.ndim), _normalize_dim(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self if a == b else apply("transpose", [self], permutation=order)

    @_view_operation
    def t(self) -> "Tensor":
        if self.ndim > 2:
            raise ShapeMismatchError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}; "
                                     f"use transpose(dim0, dim1)")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    @_view_operation
    def T(self) -> "Tensor":
        return self.permute(*reversed(range(self.ndim)))

    @_view_operation
    def unsqueeze(self, dim: int) -> "Tensor":
        dim = dim % (self.ndim + 1) if -self.ndim - 1 <= dim <= self.ndim else None
        if dim is None:
            raise ShapeMismatchError(f"unsqueeze dimension out of range for {self.ndim} dimensions")
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    @_view_operation
    def squeeze(self, dim=None) -> "Tensor":
        if dim is None:
            return self.reshape(tuple(d for d in self.shape if d != 1))
        axis = _normalize_dim(dim, self.ndim)
        if self.ndim == 0 or self.shape[axis] != 1:
            return self
        return self.reshape(self.shape[:axis] + self.shape[axis + 1:])

    @_view_operation
    def expand(self, *sizes) -> "Tensor":
        sizes = _shape_arguments(sizes)
        if len(sizes) < self.ndim:
            raise ShapeMismatchError(f"expand: {list(sizes)} has fewer dimensions than "
                                     f"{list(self.shape)}")
        lead = len(sizes) - self.ndim
        shape = tuple(self.shape[i - lead] if d == -1 else d for i, d in enumerate(sizes))
        if any(d == -1 for d in sizes[:lead]):
            raise ShapeMismatchError("expand: -1 is not allowed for new leading dimensions")
        for i, d in enumerate(self.shape):
            if d != 1 and d != shape[lead + i]:
                raise ShapeMismatchError(f"expand: cannot expand {list(self.shape)} to {list(shape)}")
        return self if shape == self.shape else apply("broadcast", [self], shape=shape)

    @_view_operation
    def expand_as(self, other: "Tensor") -> "Tensor":
        return self.expand(*_tensor_operand(other, "expand_as").shape)

    def matmul(self, other) -> "Tensor":
        """numpy/PyTorch matmul: 1-D operands are promoted and squeezed, batch dims broadcast."""
        x, y = self, _tensor_operand(other, "matmul")
        if x.dtype != y.dtype:  # PyTorch does not promote the operands of a matrix product
            raise ShapeMismatchError(f"matmul of a {x.dtype} and a {y.dtype} tensor; convert one "
                                     f"(.to(...)) so that both have the same dtype")
        if x.ndim == 0 or y.ndim == 0:
            raise ShapeMismatchError("matmul does not take 0-d tensors; use *")
        vector_x, vector_y = x.ndim == 1, y.ndim == 1
        if vector_x:
            x = x.unsqueeze(0)
        if vector_y:
            y = y.unsqueeze(1)
        batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
        if x.shape[-1] != y.shape[-2]:
            raise ShapeMismatchError(f"matmul: shapes {list(self.shape)} and "
                                     f"{list(as_tensor(other).shape)} "
                                     f"do not line up ({x.shape[-1]} != {y.shape[-2]})")
        if self.ndim > 2 and y.ndim == 2:
            # (..., m, k) @ (k, n), a linear layer on a batch, is one (... * m, k) @ (k, n)
            # product, as PyTorch folds it: one gemm, not one per batch element on a copy of y
            # broadcast in memory, and y's gradient one product, not a batch of them summed.
            rows = int(np.prod(x.shape[:-1], dtype=np.int64))
            result = apply("matmul", [x.reshape(rows, x.shape[-1]), y])
            result = result.reshape(*x.shape[:-1], y.shape[-1])
        else:
            result = apply("matmul", [x.expand(*batch, *x.shape[-2:]),
                                      y.expand(*batch, *y.shape[-2:])])
        if vector_x:
            result = result.squeeze(-2)
        if vector_y:
            result = result.squeeze(-1)
        return _fresh(result)

    def mm(self, other) -> "Tensor":
        if self.ndim != 2 or as_tensor(other).ndim != 2:
            raise ShapeMismatchError(f"mm needs two 2-d tensors, got {self.ndim}-d and "
                                     f"{as_tensor(other).ndim}-d; use matmul")
        return self.matmul(other)


def shapes_broadcast(*shapes) -> tuple[int, ...]:
    """The broadcast shape, or a ShapeMismatchError (for the user) naming the shapes."""
    try:
        return broadcast_shapes(*shapes)
    except ShapeError as error:
        raise ShapeMismatchError(str(error)) from None


def broadcast_shapes_or_none(*shapes):
    try:
        return broadcast_shapes(*shapes)
    except ShapeError:
        return None


# Creation ---------------------------------------------------------------------------------------
# The generator of tr.randn/tr.rand, made on first use: importing numpy.random takes about as long
# as importing the rest of the tracer.
_seeded: list = []  # [the generator], once made


def manual_seed(seed: int) -> None:
    _seeded[:] = [np.random.default_rng(seed)]


def _generator() -> np.random.Generator:
    if not _seeded:
        manual_seed(0)
    return _seeded[0]


def _leaf(array: np.ndarray, requires_grad: builtins.bool) -> Tensor:
    if requires_grad and not irtypes.is_float(array.dtype):
        raise ArgumentError(f"only float tensors can require gradients, got {array.dtype}")
    return Tensor._make(array, None, builtins.bool(requires_grad), leaf=True)


def _default_dtype(data) -> np.dtype:
    array = np.asarray(data)
    if array.dtype.kind == "f":
        return float32 if not isinstance(data, (np.ndarray, np.generic)) else as_dtype(array.dtype)
    if array.dtype.kind in "iu":
        return int64
    if array.dtype.kind == "b":
        return bool
    raise ArgumentError(f"cannot make a tensor from {type(data).__name__} of dtype {array.dtype}")


def tensor(data, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers or a numpy array)."""
    if isinstance(data, Tensor):
        data = data._eager_array("tr.tensor(tensor)")
    try:
        dtype = as_dtype(dtype) if dtype is not None else _default_dtype(data)
        array = np.array(data, dtype=dtype, copy=True)
    except (ValueError, TypeError) as error:
        raise ArgumentError(f"cannot make a tensor of {type(data).__name__}: {error}") from None
    if state.trace is not None:
        if requires_grad:
            raise TracingError("tr.tensor(..., requires_grad=True) inside a traced function; "
                               "pass it as an argument")
        return Tensor._make(state.trace.capture(_leaf(array, False), constant=True), state.trace,
                            False)
    return _leaf(array, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (in-place changes show through both)."""
    if not isinstance(array, np.ndarray):
        raise ArgumentError(f"from_numpy needs a numpy array, got {type(array).__name__}")
    as_dtype(array.dtype)
    return _leaf(array, False)


def full(*shape, fill_value=None, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    """`full(size, fill_value)` as in PyTorch (size a tuple or list), or `full(*size,
    fill_value=...)`."""
    if fill_value is None:
        if len(shape) != 2 or not isinstance(shape[0], (tuple, list)):
            raise ArgumentError("full takes a size (a tuple or list) and a fill value: "
                                "tr.full((2, 3), 1.5)")
        shape, fill_value = shape
    shape = _shape_arguments(shape)
    dtype = as_dtype(dtype or (float32 if isinstance(fill_value, float) else
                                       _WEAK_OF_CATEGORY[_python_scalar_category(fill_value)]))
    if state.trace is not None:
        value = constant(fill_value, dtype).expand(*shape) if shape else constant(fill_value, dtype)
        return Tensor._make(value._handle, state.trace, requires_grad, leaf=True)
    return _leaf(np.full(shape, fill_value, dtype), requires_grad)


def zeros(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    return full(*shape, fill_value=0, dtype=dtype, requires_grad=requires_grad)


def ones(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    return full(*shape, fill_value=1, dtype=dtype, requires_grad=requires_grad)


def full_like(x: Tensor, fill_value, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full(*x.shape, fill_value=fill_value, dtype=dtype or x.dtype, requires_grad=requires_grad)


def zeros_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full_like(x, 0, dtype, requires_grad)


def ones_like(x: Tensor, dtype=None, requires_grad: builtins.bool = False) -> Tensor:
    return full_like(x, 1, dtype, requires_grad)


def eager_generator(kind: str) -> np.random.Generator:
    """The generator `tr.manual_seed` seeds, for `kind` (a function name) outside a trace."""
    if state.trace is not None:
        raise TracingError(f"tr.{kind} inside a traced function would give the same numbers on "
                           f"every call; make the random tensor outside and pass it as an argument")
    return _generator()


def _random(kind: str, shape, dtype, requires_grad) -> Tensor:
    generator = eager_generator(kind)
    shape = _shape_arguments(shape)
    sample = generator.standard_normal(shape) if kind == "randn" else generator.random(shape)
    return _leaf(sample.astype(as_dtype(dtype)), requires_grad)


def randn(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    """Standard normal samples from the generator seeded by `tr.manual_seed`."""
    return _random("randn", shape, dtype, requires_grad)


def rand(*shape, dtype=float32, requires_grad: builtins.bool = False) -> Tensor:
    """Uniform samples in [0, 1) from the generator seeded by `tr.manual_seed`."""
    return _random("rand", shape, dtype, requires_grad)


def iota(shape: Sequence[int], dimension: int, dtype=int64) -> Tensor:
    """The index along `dimension`, broadcast to `shape`."""
    return apply("iota", [], shape=tuple(shape), dimension=dimension, dtype=dtype)


def arange(end, dtype=None) -> Tensor:
    """0, 1, ..., below `end` (int64, or float32 for a float `end`)."""
    if dtype is None:
        dtype = float32 if isinstance(end, float) else int64
    return iota((int(np.ceil(end)),), 0, dtype)
