"""Thread-local state: whether gradients are recorded, and which trace (if any) is recording."""
from __future__ import annotations

import contextlib
import threading


class _State(threading.local):
    grad_enabled = True
    trace = None  # the tracer.tracing.Trace being recorded, or None for eager mode
    # how many tr.grad / vjp / jvp transforms are differentiating the code running now
    transforms = 0
    creating_graph = False  # a backward with create_graph=True (eager or traced) is running
    forward_changes = None  # tracer.function_forward.ForwardChanges of the Function forwards running


state = _State()


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


class no_grad(_GradMode):
    """Context manager (and decorator) in which operations record no gradient."""
    enabled = False


class enable_grad(_GradMode):
    """Context manager (and decorator) that turns gradient recording back on inside no_grad."""
    enabled = True


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    previous = state.grad_enabled
    state.grad_enabled = bool(mode)
    try:
        yield
    finally:
        state.grad_enabled = previous
