"""The Tensor: one handle over two kinds of value, and the state autograd and in-place changes keep.

In eager mode a Tensor holds a numpy array and operations run the reference semantics at once,
recording a tape for backward. Inside `@trace` it holds an `ir.Value` and operations append
primitives to the trace's graph. Every operation goes through `tracer.dispatch.apply`, which is the
only place that knows the difference.

This module is the bottom of the tracer's layers: the class holds its state, reads values out and
counts versions, and imports no other part of the tracer. Its operations are defined above, each
group in the module of its job (dispatch, layout, arithmetic, reductions, inplace, backward), and
`tracer/methods.py` gives them to the class with `add_methods`, so that the dependencies between
those modules point one way.
"""
from __future__ import annotations

import builtins
import types

import numpy as np

from tracer.ir import types as irtypes
from tracer.context import state
from tracer.errors import (ArgumentError, HostValuesNeeded, InplaceError, ShapeMismatchError,
                           SpecializationNeeded, user_line)


class Tensor:
    """A tensor with PyTorch's API; see the module docstring for the two modes and where the
    operations are defined."""

    __slots__ = ("_handle", "_trace", "_requires_grad", "_node", "_output_index", "_grad", "_base",
                 "_view_of", "_view_base", "_view_version", "_view_shares_version",
                 "_base_version",
                 "_version", "_changed_at", "_saved_by", "_weak", "_leaf", "_accumulator",
                 "__weakref__")
    __array_priority__ = 1000  # numpy defers `array * tensor` to Tensor.__rmul__

    @classmethod
    def _make(cls, handle, trace, requires_grad: builtins.bool, node=None, output_index: int = 0,
              leaf: builtins.bool | None = None) -> "Tensor":
        """A tensor holding `handle` (a numpy array, or an ir.Value of `trace`), computed by output
        `output_index` of the eager tape's `node` (a tracer.autograd.Node) if it has one."""
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
        self._view_shares_version = False  # whether PyTorch's view shares that tensor's version
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
        if self._trace is not None and requires_grad and not self._requires_grad:
            self._trace.own_value(self)
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
        if trace is not None and self._trace is trace:
            trace.note_grad(self, "read")
        return self._grad

    @grad.setter
    def grad(self, value: "Tensor | None") -> None:
        check_grad(self, value)
        trace = state.trace
        if trace is not None and self._trace is None:
            trace.set_grad(self, value)
        else:
            if trace is not None and self._trace is trace:
                trace.note_grad(self, "written")
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
        if self._trace is not None and self._trace.labels:  # in a custom Function
            # (which then runs as a host callback: tracer/host_function.py)
            raise HostValuesNeeded(
                f"{what} in {self._trace.labels[-1]} needs the value of a traced tensor: under "
                f"@tr.trace a Function's forward and backward that read values run in Python "
                f"when the compiled function runs, but this one reads them where that cannot be "
                f"done", self._handle, what)
        if self._trace is not None:
            raise SpecializationNeeded(
                f"{what} needs the value of a traced tensor, which is only known when the compiled "
                f"function runs; return the tensor from the traced function and read it outside, "
                f"or use tr.where(...) instead of Python control flow on its value", self._handle,
                what)
        return self._handle

    def numpy(self) -> np.ndarray:
        """The tensor's own buffer. As PyTorch, refused for a tensor that requires grad while
        gradients are recorded, and allowed without (a custom Function's forward, tr.no_grad())."""
        array = self._eager_array(".numpy()")
        if self.requires_grad and state.grad_enabled:
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
        if self._trace is not None:  # a comparison of a runtime float (see Trace.decided)
            outcome = self._trace.decided(self._handle)
            if outcome is not None:
                return outcome
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
        if self.dtype != irtypes.int64:
            raise ArgumentError("only integer tensors can be used as an index")
        return int(self)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise ArgumentError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        suffix = ", requires_grad=True" if self.requires_grad else ""
        if self._trace is not None:
            return f"Tensor(traced %{self._handle.name}: {self._handle.type}{suffix})"
        check_current(self)
        body = np.array2string(self._handle, separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype}{suffix})"

    def _mark_changed(self, at: str | None = None) -> None:
        """Count an in-place change: a newer version, where it happened (`at`, the user's line,
        found here unless the caller found it once for many tensors), and word to every tape node
        that saved this tensor for its backward (which may run after the tensor is gone)."""
        self._version += 1
        self._changed_at = at or user_line()
        for reference in self._saved_by:
            node = reference()
            if node is not None:
                node.note_change(self)

    def detach_(self) -> "Tensor":
        self._requires_grad, self._node, self._leaf = False, None, True
        return self


def mark_view(result: "Tensor", base: "Tensor", what: str, shares_version: bool = True
              ) -> "Tensor":
    """Mark what a PyTorch view operation returns: here it is a copy. An in-place change to it is
    refused (it could not reach the tensor it came from), and so is reading it after its base was
    changed in place (a PyTorch view would show the change): never a silently stale value. With
    `shares_version` (PyTorch's result is surely a view, sharing its base's version counter), a
    backward that reads the copy also refuses an in-place change of the base after it."""
    root = base
    while root._view_base is None and root._base is not None:
        root = root._base  # a detach() alias shares its original's memory (and version, PyTorch's)
    root = root if root._view_base is None else root._view_base
    result._view_of = what
    # A reference, not a weak one, as a PyTorch view keeps its base alive: the check must still
    # see the in-place change after the caller dropped the base.
    result._view_base = root
    result._view_version = root._version
    result._view_shares_version = shares_version
    if shares_version and result._trace is not None:
        result._trace.note_view(result._handle, root._handle)
    return result


def check_grad(tensor: "Tensor", grad) -> None:
    """Refuse, on the line that assigns it, a `.grad` that PyTorch refuses: anything but None or a
    tensor of the tensor's shape and dtype (backward would add into it, or fail later inside)."""
    if grad is None:
        return
    if not isinstance(grad, Tensor):
        raise ArgumentError(f"a .grad must be a tensor or None, not a {type(grad).__name__}; "
                            f"assign tr.full_like(x, value) for a constant gradient")
    if grad.shape != tensor.shape:
        raise ShapeMismatchError(f"a .grad of shape {list(grad.shape)} assigned to a tensor of "
                                 f"shape {list(tensor.shape)}; a gradient has its tensor's shape")
    if grad.dtype != tensor.dtype:
        raise ShapeMismatchError(f"a {grad.dtype} .grad assigned to a {tensor.dtype} tensor; "
                                 f"convert it with .to(tr.{tensor.dtype})")


def check_current(tensor: "Tensor") -> None:
    """Raise if `tensor` is a view-copy whose base has been changed in place since it was taken."""
    base = tensor._view_base
    if base is not None and base._version != tensor._view_version:
        raise InplaceError(
            f"this tensor is the result of {tensor._view_of}, a copy here, taken before the tensor "
            f"it came from was changed in place at {base._changed_at}; a PyTorch view would show "
            f"the change. Take it again after the change (or clone() it before, to keep the old "
            f"values)")


# What every class body holds besides what it defines.
_CLASS_BOOKKEEPING = frozenset(vars(type("Group", (), {})))


def add_methods(group: type) -> None:
    """Give Tensor the methods and properties defined in the body of the class `group` (which is
    never instantiated: it only groups one module's part of the Tensor API). A name defined twice
    is an error, so that no group silently replaces another's method."""
    for name, member in vars(group).items():
        if name in _CLASS_BOOKKEEPING:
            continue
        if name in vars(Tensor):
            raise TypeError(f"Tensor.{name} is defined twice ({group.__qualname__})")
        # What users see (repr of a bound method, help) names Tensor, not the group.
        for function in (member.fget, member.fset) if isinstance(member, property) else (member,):
            # (and the functions a decorator wraps, whose code raises the TypeError of a wrong
            # argument count under the qualified name of the function itself)
            while isinstance(function, types.FunctionType) and function.__name__ == name:
                function.__qualname__ = f"Tensor.{name}"
                function = getattr(function, "__wrapped__", None)
        setattr(Tensor, name, member)
