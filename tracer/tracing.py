"""The recording side of `@trace`: one Trace collects a function's primitives into an ir.Graph."""
from __future__ import annotations

import contextlib
import numbers

from tracer.ir.builder import GraphBuilder
from tracer.ir.graph import Graph, Instruction, Value
from tracer.ir.types import TensorType, float64, int64
from tracer.context import state
from tracer.errors import TracingError, user_line
from tracer.tensor import Tensor


# The slots of a captured tensor that tracing changes; `Trace.release` puts them back.
_CAPTURED_SLOTS = ("_handle", "_trace", "_node", "_output_index", "_grad", "_base", "_view_base",
                   "_version", "_changed_at", "_saved_by", "_leaf", "_accumulator")


class Captured:
    """A tensor from outside the traced function that is a runtime input of it. (Not a
    dataclass: making its methods took ~1 ms of `import tracer`.)"""

    def __init__(self, tensor: Tensor, saved: tuple, value: Value, grad: Value | None,
                 constant: bool):
        self.tensor = tensor
        self.saved = saved  # its _CAPTURED_SLOTS on entry
        self.value = value  # the parameter holding its data
        self.grad = grad  # the parameter holding its .grad, if it had one
        self.constant = constant  # made inside the traced function (tr.tensor): never written back


class Trace:
    """The state of one function being traced."""

    # Whether a tensor computed outside from tensors that require grad is refused as an input (a
    # compiled function cannot send gradients back into it; vmap's element trace, replayed on the
    # tensors themselves, can).
    refuses_computed = True

    def __init__(self, name: str):
        self.function = Graph(name)
        self.labels: list[str] = []      # e.g. "MyReLU.forward" while a Function's forward runs
        self.builder = GraphBuilder(self.function, self.location)
        self.captured: list[Captured] = []
        # After `release`, a custom backward traced again (runtime/differentiable.py's split)
        # reads a captured tensor as the parameter it was, and may capture nothing new.
        self.released = False
        self.leaves: list[Tensor] = []  # traced leaf tensors that require grad
        # The proxies of the argument tensors, by id of the caller's tensor: the function may also
        # reach an argument through a global name.
        self.arguments: dict[int, Tensor] = {}
        # (ctx, output values) of every custom Function applied, for the checks of a backward.
        self.custom_calls: list[tuple] = []
        # Tensor.register_hook on traced tensors: the hooks by id of the value they watch
        self.gradient_hooks: dict[int, list] = {}
        # An in-place change rebinds a tensor to a new value. The old values it leaves behind: by
        # id, where they were overwritten and the instruction of the change itself, which may
        # still read them (eager mode's version counters, as values); and every value a leaf has
        # held, whose gradients all go to the leaf (PyTorch's accumulator outlives the change).
        self.overwritten: dict[int, tuple[str, Instruction | None]] = {}
        # The value of a view-copy's base when it was taken, by id of the view-copy's value: a
        # backward that reads the view-copy reads the base too (a PyTorch view shares its changes).
        self._view_bases: dict[int, Value] = {}
        self._leaf_history: dict[int, list[Value]] = {}
        # By id of a tensor that started to require grad here: the identity value it was given
        # then (own_value), which is no change of its data.
        self._own_values: dict[int, Value] = {}
        # (argument leaf index, proxy, its data and .grad values on entry) of the tensors and
        # arrays among the arguments: what the function changes of them is written back.
        self._argument_entries: list[tuple[int, Tensor, Value, Value | None]] = []
        # By id of an argument's proxy or a captured tensor: what the function did first with the
        # .grad it was called with, "read" or "written" (its incoming .grad matters only if read).
        self._grad_events: dict[int, str] = {}
        # Runtime floats read from outside the function, by id of their parameter (set by the
        # runtime), and what decides a comparison of one in Python (see runtime/floats.py).
        self.float_inputs: dict = {}
        self.decider = None
        # A context in which code run while tracing may draw from Python's and numpy's random
        # generators, undone after (a host Function's forward, run once to learn its results'
        # shapes): set by the runtime (runtime/random_draws.py), which refuses other draws.
        self.draws_undone = contextlib.nullcontext
        # The values the parameters hold in the call being traced, by id of the parameter: a
        # Function that runs on the host is run once on the values it gets (tracer/host_function.py).
        self.parameter_values: dict[int, object] = {}

    def location(self) -> str:
        line = user_line()
        return f"{line} ({self.labels[-1]})" if self.labels else line

    @contextlib.contextmanager
    def label(self, text: str):
        self.labels.append(text)
        try:
            yield
        finally:
            self.labels.pop()

    @contextlib.contextmanager
    def emitting_into(self, builder: GraphBuilder):
        """Record into `builder`'s instruction list (the autodiff pass expanding a directive)."""
        previous = self.builder
        self.builder = GraphBuilder(builder.function, self.location, builder.instructions)
        try:
            yield
        finally:
            self.builder = previous

    def parameter(self, name: str, type: TensorType) -> Value:
        return self.function.add_parameter(name, type)

    def add_argument(self, value, name: str, index: int) -> tuple[Tensor, list[str]]:
        """The proxy that stands for argument leaf number `index` of the traced function -- a
        Tensor, a numpy array or a Python number -- and the kinds of the parameters made for it,
        in order: "number"; or "leaf", then "grad" for a tensor that has a .grad."""
        if isinstance(value, numbers.Number):
            proxy = self.add_number(name, isinstance(value, numbers.Integral))
            self.parameter_values[id(proxy._handle)] = value
            return proxy, ["number"]
        requires_grad = isinstance(value, Tensor) and value.requires_grad
        proxy = Tensor._make(self.parameter(name, TensorType(value.shape, value.dtype)), self,
                             requires_grad, leaf=True)
        self.parameter_values[id(proxy._handle)] = (value._handle if isinstance(value, Tensor)
                                                    else value)
        kinds = ["leaf"]
        grad = value._grad if isinstance(value, Tensor) else None
        if grad is not None:
            grad_value = self.parameter(f"{name}_grad", TensorType(grad.shape, grad.dtype))
            self.parameter_values[id(grad_value)] = grad._handle
            proxy._grad = Tensor._make(grad_value, self, False)
            kinds.append("grad")
        if isinstance(value, Tensor):
            self.arguments[id(value)] = proxy  # also read through a global name
        self._argument_entries.append((index, proxy, proxy._handle, None if grad is None
                                       else proxy._grad._handle))
        return proxy, kinds

    def add_number(self, name: str, integral: bool) -> Tensor:
        """The proxy of a Python number that is a runtime input: a 0-d int64 or float64 parameter
        that does not widen float32 tensors, as the number would not."""
        dtype = int64 if integral else float64
        proxy = Tensor._make(self.parameter(name, TensorType((), dtype)), self, False)
        proxy._weak = True
        return proxy

    def decided(self, value: Value) -> bool | None:
        """The outcome of a traced bool the function needs in Python, where the runtime can take
        it from a runtime float's value (see runtime/floats.py); None where it cannot."""
        return None if self.decider is None else self.decider(value)

    def note_grad(self, tensor: Tensor, event: str) -> None:
        """`tensor` (an argument's proxy or a captured tensor) had its .grad "read" or "written"."""
        self._grad_events.setdefault(id(tensor), event)

    def grad_read(self, tensor: Tensor) -> bool:
        """Whether the function read the .grad `tensor` had on entry (before writing one)."""
        return self._grad_events.get(id(tensor)) == "read"

    def capture(self, tensor: Tensor, constant: bool = False) -> Value:
        """A tensor from outside the traced function (read from a closure, a global or an object's
        attribute, or made by tr.tensor inside it) becomes a runtime input. Until `release`, the
        tensor itself stands for that input, as an argument's proxy does: operations on it, its
        .grad (a runtime input too) and in-place changes of either are traced."""
        if tensor.requires_grad and not tensor.is_leaf and self.refuses_computed:
            raise TracingError(
                f"the traced function uses a tensor of shape {list(tensor.shape)} computed outside "
                f"it from tensors that require grad; gradients cannot flow from the compiled code "
                f"into that computation. Compute it inside the traced function, pass it as an "
                f"argument, or use its .detach()")
        saved = tuple(getattr(tensor, slot) for slot in _CAPTURED_SLOTS)
        name = f"captured{len(self.captured)}"
        value = self.parameter(name, TensorType(tensor.shape, tensor.dtype))
        self.parameter_values[id(value)] = tensor._handle
        grad = tensor._grad
        tensor._handle, tensor._trace, tensor._node, tensor._leaf = value, self, None, True
        tensor._base = tensor._view_base = tensor._accumulator = None
        tensor._saved_by = []  # the eager tape learns of changes when the compiled code runs
        grad_value = None
        if grad is not None:
            grad_value = self.parameter(f"{name}_grad", TensorType(grad.shape, grad.dtype))
            self.parameter_values[id(grad_value)] = grad._handle
            tensor._grad = Tensor._make(grad_value, self, False)
        if tensor.requires_grad:
            self.leaves.append(tensor)
        self.captured.append(Captured(tensor, saved, value, grad_value, constant))
        return value

    def release(self) -> None:
        """Give every captured tensor back the state it had before tracing."""
        for captured in self.captured:
            for slot, value in zip(_CAPTURED_SLOTS, captured.saved):
                setattr(captured.tensor, slot, value)
        self.released = True

    def writebacks(self, outputs: list, first_captured: int) -> tuple[list, list, list]:
        """What the traced function changed of its arguments' tensors and arrays and of the
        tensors it captured (leaf indices from `first_captured` on, in order): (leaf index, "data"
        | "grad" | "new_grad", output index) of every value to write back, each appended to
        `outputs` ("new_grad": a .grad the function set anew, without reading the one it was
        called with); the leaves whose .grad it set to None; and the leaves whose incoming .grad
        it did not read (whether they have one is no part of the signature)."""
        entries = self._argument_entries + [
            (first_captured + k, c.tensor, c.value, c.grad)
            for k, c in enumerate(self.captured) if not c.constant]
        writebacks, cleared, unread = [], [], []
        for index, tensor, original_data, original_grad in entries:
            event = self._grad_events.get(id(tensor))
            if event != "read":
                unread.append(index)
            if tensor._handle is not original_data and \
                    tensor._handle is not self._own_values.get(id(tensor)):
                writebacks.append((index, "data", len(outputs)))
                outputs.append(tensor._handle)
            if tensor._grad is None:
                if original_grad is not None or event == "written":
                    cleared.append(index)
            elif tensor._grad._handle is not original_grad:
                writebacks.append((index, "new_grad" if event == "written" else "grad",
                                   len(outputs)))
                outputs.append(self.handle_of(tensor._grad))
        return writebacks, cleared, unread

    def result_relations(self, results: list, first_captured: int
                         ) -> tuple[list[tuple[int, int, str]], list[tuple[int, int, str, str, bool]]]:
        """How the results relate to the arguments' tensors and the captured ones (leaf indices
        from `first_captured` on), as eager mode's would: (aliases, views).

        aliases: (result position, leaf index, "data" | "grad" | "detach") of every result that
        is such a tensor's stand-in, its .grad, or a detach() of it: the call returns that tensor
        itself (`return x`, `return x.grad`, as torch.compile does) or its detach(), which shares
        its memory as eagerly. views: (result position, leaf index, "data" | "grad", view
        operation, whether it shares the version) of every result that is a view-copy of one
        (mark_view): the call marks its result so, and changing it in place, or reading it after
        its base changed, is refused as eagerly."""
        entries: dict[int, tuple[int, str]] = {}
        for index, tensor in [(index, tensor) for index, tensor, *_ in self._argument_entries] + [
                (first_captured + k, c.tensor) for k, c in enumerate(self.captured)
                if not c.constant]:
            entries.setdefault(id(tensor), (index, "data"))
            if tensor._grad is not None:
                entries.setdefault(id(tensor._grad), (index, "grad"))
        aliases, views = [], []
        for position, result in enumerate(results):
            if not isinstance(result, Tensor):
                continue
            # back through view-copies (to their base) and detach() aliases (to what they detach)
            view, base = None, result
            while base is not None and id(base) not in entries:
                if base._view_base is not None:
                    view = view or base  # the last view operation, whose name eager mode gives
                    base = base._view_base
                else:
                    base = base._base
            if base is None:
                continue
            index, kind = entries[id(base)]
            if view is not None:
                views.append((position, index, kind, view._view_of, view._view_shares_version))
            elif base is result:
                aliases.append((position, index, kind))
            elif kind == "data":
                aliases.append((position, index, "detach"))
        return aliases, views

    def owns(self, tensor: Tensor) -> bool:
        """Whether `tensor` was made by this trace (or stands in it for an input)."""
        return tensor._trace is self

    def location_of(self, tensor: Tensor) -> str | None:
        """The user's line that computed a tensor of this trace (None for an input)."""
        producer = tensor._handle.producer
        return producer.location if producer is not None else None

    def grad_of(self, tensor: Tensor) -> "Tensor | None":
        """The traced .grad of an untraced `tensor` read inside the trace."""
        tensor = self.stand_in(tensor)
        self.note_grad(tensor, "read")
        return tensor._grad

    def set_grad(self, tensor: Tensor, grad: "Tensor | None") -> None:
        tensor = self.stand_in(tensor)
        self.note_grad(tensor, "written")
        tensor._grad = grad

    def stand_in(self, tensor: Tensor) -> Tensor:
        """What stands for `tensor` in this trace: an argument's proxy, or the tensor captured."""
        if id(tensor) in self.arguments:
            return self.arguments[id(tensor)]
        self.capture(tensor)
        return tensor

    def note_view(self, view: Value, base: Value) -> None:
        self._view_bases[id(view)] = base

    def changed_since(self, value: Value) -> tuple[Value, str, Instruction | None] | None:
        """The value overwritten in place since `value` was read -- `value` itself or the base of
        the view-copy it is -- with where and the instruction of the change; None if neither."""
        for candidate in (value, self._view_bases.get(id(value))):
            if candidate is not None and id(candidate) in self.overwritten:
                return (candidate, *self.overwritten[id(candidate)])
        return None

    def rebind(self, tensor: Tensor, value: Value, changing: Value) -> None:
        """`tensor` now holds `value`, computed in place from its old value by the instruction
        that produced `changing`."""
        old = tensor._handle
        self.overwritten[id(old)] = (user_line(), changing.producer)
        if tensor.is_leaf and tensor.requires_grad:
            self._leaf_history.setdefault(id(tensor), []).append(old)
        tensor._handle = value

    def own_value(self, tensor: Tensor) -> None:
        """`tensor` starts to require grad: it gets a value of its own, an identity of the one it
        holds, so that a gradient with respect to it takes in no earlier use of that value -- its
        own from before (PyTorch's graph did not record them) or another tensor's that holds the
        same value (a detach() alias of it, or of what it aliases)."""
        tensor._handle = self.builder.op("reshape", self.handle_of(tensor), shape=tensor.shape)
        self._own_values[id(tensor)] = tensor._handle

    def leaf_values(self, tensor: Tensor) -> list[Value]:
        """The values `tensor` has held while it was a leaf, the current one last."""
        tensor = self.arguments.get(id(tensor), tensor)
        return self._leaf_history.get(id(tensor), []) + [self.handle_of(tensor)]

    def gradient_sources(self, leaving_out: frozenset[int] = frozenset()) -> list[Value]:
        """The values a gradient can flow into the user's autograd from: those of the leaves that
        require grad (but the tensors whose ids are `leaving_out`)."""
        return [value for tensor in self.leaves if tensor.requires_grad
                and id(tensor) not in leaving_out for value in self.leaf_values(tensor)]

    def handle_of(self, tensor: Tensor) -> Value:
        if tensor._trace is self:
            if tensor._base is not None:
                self._follow_base(tensor)
            return tensor._handle
        if tensor._trace is not None:
            raise escaped_error()
        if id(tensor) in self.arguments:
            return self.arguments[id(tensor)]._handle
        if self.released:
            for captured in self.captured:
                if captured.tensor is tensor:
                    return captured.value
            raise TracingError(f"{self.function.name} has been traced: a tensor it did not read "
                               f"cannot become its input now")
        return self.capture(tensor)

    def _follow_base(self, alias: Tensor) -> None:
        """Traced, a detach() alias is a value of its own: after an in-place change of its base it
        takes the base's new value (eagerly the two share one buffer, as in PyTorch)."""
        base = alias._base
        if base._version == alias._base_version:
            return
        handle = self.handle_of(base)
        if base.requires_grad:
            (handle,) = self.builder.emit("stop_gradient", [handle], {})
        alias._handle, alias._base_version = handle, base._version


def escaped_error() -> TracingError:
    return TracingError(
        "this tensor was created inside a traced function that has finished (or another one); "
        "return it from the traced function instead of keeping it")


@contextlib.contextmanager
def tracing(trace: Trace):
    previous = state.trace
    state.trace = trace
    try:
        yield trace
    finally:
        state.trace = previous


def current_tensor(tensor: Tensor) -> Tensor:
    """The tensor that stands for `tensor` in the trace being recorded: the proxy of an argument
    (whose `.grad` the traced backward fills), else `tensor` itself. Code that holds the caller's
    tensors, as an optimizer does, reads `.grad` and writes through this."""
    trace = state.trace
    return tensor if trace is None else trace.arguments.get(id(tensor), tensor)

