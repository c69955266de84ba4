"""Thread-local state: whether gradients are recorded, and which trace (if any) is recording."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


class _State(threading.local):
    grad_enabled = True
    inference = False  # inside inference_mode() (whose only effect here is no_grad's)
    trace = None  # the tracer.tracing.Trace being recorded, or None for eager mode
    creating_graph = False  # a backward with create_graph=True (eager or traced) is running
    forward_changes = None  # tracer.function_forward.ForwardChanges of the Function forwards running
    # (object, name) of every attribute asked of tracer's own objects and absent while a traced
    # function is recorded (see AbsentNamesNoted), or None outside
    absent_reads = None


state = _State()


class AbsentNamesNoted:
    """Base of tracer's own classes whose objects user code may ask for a name they lack
    (`getattr(self.linear, "scale", 1.0)`, `hasattr(opt, "foo")`, `try: self.temperature`): the
    ask is noted while a traced function is recorded, and its guards then see the name set later
    (runtime/guards.py). Python calls __getattr__ only when the name is absent: nothing else pays.
    """

    def __getattr__(self, name: str):
        if state.absent_reads is not None and not name.startswith("__"):
            state.absent_reads.append((self, name))
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


@contextlib.contextmanager
def noting_absent_reads(reads: list | None) -> Iterator[None]:
    """Inside the block, AbsentNamesNoted appends to `reads` (and, after it, to the list of a
    recording around it: a traced function called while another is traced); None: to nothing,
    while tracer itself looks over the user's objects (runtime/reach.py)."""
    previous, state.absent_reads = state.absent_reads, reads
    try:
        yield
    finally:
        state.absent_reads = previous
        if previous is not None and reads is not None:
            previous.extend(reads)


@contextlib.contextmanager
def recording_no_graph() -> Iterator[None]:
    """Inside the block, no backward's own graph is being recorded (state.creating_graph)."""
    previous, state.creating_graph = state.creating_graph, False
    try:
        yield
    finally:
        state.creating_graph = previous


def is_grad_enabled() -> bool:
    return state.grad_enabled


class _GradMode(contextlib.ContextDecorator):
    enabled: bool

    def __enter__(self):
        self._previous = state.grad_enabled
        state.grad_enabled = self.enabled

    def __exit__(self, *exc):
        state.grad_enabled = self._previous
        return False


class _BareDecorator(_GradMode):
    """A mode that is also a decorator with or without the call: `@tr.no_grad` and
    `@tr.inference_mode` decorate as PyTorch 2's do (a bare `@tr.no_grad` was a TypeError)."""

    def __new__(cls, argument=None):
        if callable(argument):
            return cls()(argument)
        return super().__new__(cls)

    def __init__(self, function: Callable | None = None):
        pass  # (a function was decorated by __new__)


class no_grad(_BareDecorator):
    """Context manager (and decorator) in which operations record no gradient."""
    enabled = False


class enable_grad(_BareDecorator):
    """Context manager (and decorator) that turns gradient recording back on inside no_grad."""
    enabled = True


class set_grad_enabled(_GradMode):
    """PyTorch's: sets grad mode on or off when made, so that `tr.set_grad_enabled(False)` called
    as a function turns it off from then on (as a context manager the mode before it comes back
    at the end of the block; as a decorator the mode holds inside the function alone)."""

    def __init__(self, mode: bool):
        self._previous = state.grad_enabled
        self.enabled = bool(mode)
        state.grad_enabled = self.enabled

    def __enter__(self):  # (the mode to come back to is the one before it was made)
        state.grad_enabled = self.enabled

    def __call__(self, function: Callable) -> Callable:
        state.grad_enabled = self._previous  # decorating does not change the mode
        return super().__call__(function)


def is_inference_mode_enabled() -> bool:
    return state.inference


class inference_mode(_BareDecorator):
    """PyTorch's inference_mode: gradients are not recorded inside (and with mode=False they
    are, as PyTorch's turns grad mode on then). A decorator with or without the call. (PyTorch's
    inference tensors also refuse autograd and in-place changes later; here they are ordinary
    tensors made under no_grad.)"""

    def __init__(self, mode: bool = True):
        self.mode = mode
        self.enabled = not mode

    def __enter__(self):
        self._previous_inference = state.inference
        state.inference = self.mode
        super().__enter__()

    def __exit__(self, *exc):
        state.inference = self._previous_inference
        return super().__exit__(*exc)
