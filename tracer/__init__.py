"""A tracing compiler for differentiable programs with PyTorch's API: `import tracer as tr`."""
from tracer.context import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from tracer.errors import (ArgumentError, FunctionBackwardError, GradcheckError, InplaceError,
                           ShapeMismatchError, TracerError, TracingError)
from tracer.function import Function, FunctionCtx, autograd_function
from tracer.functional import FUNCTIONS, cat, stack
from tracer.gradcheck import gradcheck
from tracer.tensor import (Tensor, arange, bool, float32, float64, from_numpy, full, full_like,
                           int64, manual_seed, ones, ones_like, rand, randn, tensor, where, zeros,
                           zeros_like)
from tracer.transforms import grad, value_and_grad

globals().update(FUNCTIONS)  # tr.exp, tr.sum, tr.matmul, ... (see tracer/functional.py)


def __getattr__(name: str):
    # `trace` ties the tracer to the compiler, so it lives in runtime/ (which imports tracer);
    # users reach it from here, imported on first use.
    if name in ("trace", "TracedFunction"):
        import runtime.trace
        return getattr(runtime.trace, name)
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")
