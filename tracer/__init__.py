"""A tracing compiler for differentiable programs with PyTorch's API: `import tracer as tr`.

Only the name `tracer` is installed: the folders `ir/`, `codegen/` and `runtime/` beside this one
in the repository are its subpackages `tracer.ir`, `tracer.codegen` and `tracer.runtime`
(pyproject.toml maps them). From a checkout on PYTHONPATH, where they are not inside this folder,
the repository root joins the package path so that the same names resolve.
"""
import os as _os

__version__ = "0.2.0"  # pyproject.toml reads it from here

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "ir")) and _os.path.isfile(
        _os.path.join(_ROOT, "ir", "__init__.py")):
    __path__.append(_ROOT)
from tracer.tensor import Tensor
from tracer import methods as _methods  # gives Tensor its operations, before anything uses them
from tracer.device import device
from tracer.context import (enable_grad, inference_mode, is_grad_enabled,
                            is_inference_mode_enabled, no_grad, set_grad_enabled)
from tracer.errors import (ArgumentError, BoundsError, CacheLimitWarning, FunctionBackwardError,
                           GradcheckError, IndexOutOfRangeError, InplaceError, RecompileWarning,
                           HostCallbackError, SettingError, ShapeMismatchError, TracerError,
                           TracerWarning, TracingError)
from tracer.function import Function, FunctionCtx, once_differentiable
from tracer.r_function import autograd_function
from tracer.functional import FUNCTIONS as _FUNCTIONS, cat, stack
from tracer.einsum import einsum
from tracer.ops import FUNCTIONS as _OPS
from tracer.math_functions import FUNCTIONS as _MATH_FUNCTIONS
from tracer.arc_functions import FUNCTIONS as _ARC_FUNCTIONS
from tracer.cumulative import FUNCTIONS as _CUMULATIVE
from tracer.medians import FUNCTIONS as _MEDIANS
from tracer.rearranging import FUNCTIONS as _REARRANGING
from tracer.products import FUNCTIONS as _PRODUCTS
from tracer.division import FUNCTIONS as _DIVISION
from tracer.selection import FUNCTIONS as _SELECTION
from tracer.gradcheck import gradcheck, gradgradcheck
from tracer.interop import from_dlpack
from tracer.logs import configure_from_environment as _configure_logging
from tracer.arithmetic import where
from tracer.creation import (arange, as_tensor, empty_like, from_numpy, full, full_like, ones,
                             ones_like, tensor, zeros, zeros_like)
from tracer.dtypes import bool, float32, float64, int64
from tracer.random import (Generator, default_generator, get_rng_state, manual_seed, rand,
                           rand_like, randint, randn, randn_like, randperm, set_rng_state)
from tracer.transforms import grad, jvp, value_and_grad, vjp
from tracer.jacobians import hessian, jacrev
from tracer.vmapping import vmap
from tracer.pure_callback import ShapeDtypeStruct, pure_callback
from tracer.serialization import load, save

float, double, long = float32, float64, int64  # PyTorch's aliases (tr.float is not builtins.float)
globals().update(_FUNCTIONS)  # tr.exp, tr.sum, tr.matmul, ... (see tracer/functional.py)
globals().update(_OPS)  # tr.var, tr.tril, tr.eye, ... (see tracer/ops.py)
# tr.isnan, tr.asin, tr.cumsum, tr.median, tr.flip, tr.outer, ...
globals().update(_MATH_FUNCTIONS, **_ARC_FUNCTIONS, **_CUMULATIVE, **_MEDIANS, **_REARRANGING,
                 **_PRODUCTS, **_DIVISION, **_SELECTION)
_configure_logging()


# The public modules and the names imported on first use; the internal modules (tracer.tensor,
# tracer.dispatch, ...) are attributes too, but not listed by dir(tr).
_PUBLIC_MODULES = ("trace", "TracedFunction", "nn", "optim", "distributed", "autograd",
                   "serialization")


def __dir__() -> list[str]:
    """The public names, including those imported on first use (`trace`, `nn`, `optim`)."""
    public = (name for name, value in globals().items()
              if not name.startswith("_") and not isinstance(value, type(_os)))
    return sorted({*public, *_PUBLIC_MODULES, "__version__"})


def __getattr__(name: str):
    # `trace` ties the tracer to the compiler, so it lives in runtime/ (which imports tracer);
    # users reach it from here, imported on first use.
    if name in ("trace", "TracedFunction"):
        from tracer.runtime import traced_function as traced
        return getattr(traced, name)
    if name in ("nn", "optim", "distributed"):  # imported on first use: `import tracer` stays quick
        import importlib
        return importlib.import_module(f"tracer.{name}")
    raise AttributeError(f"module 'tracer' has no attribute {name!r}")
