"""Where one of tracer's primitives stands for several PyTorch operations whose backwards differ
on a ZeroTensor (sgn's gradient; `ir.vjp.ZERO` here), the function of the operation says which
PyTorch's is: mean is reduce_sum then div, which keep a symbolic zero, but PyTorch's mean_backward
makes zeros of it; cat is pad, whose rule does not keep one, but cat's backward in PyTorch is
slices, views that do (docs/findings.md, F33)."""
from __future__ import annotations

from tracer.ir import types as irtypes
from tracer.ir.vjp import ZERO_KEPT, ZEROS_MADE
from tracer.context import state
from tracer.dispatch import apply
from tracer.tensor import Tensor


def _zero_boundary(rule, result: Tensor, inputs) -> Tensor:
    # (eagerly only on the way of a gradient: a trace's custom_vjp costs nothing once compiled)
    if not irtypes.is_float(result.dtype) or (state.trace is None and not result.requires_grad):
        return result
    passed = apply("custom_vjp", [result, result, *inputs], num_outputs=1, rule=rule)
    passed._weak = result._weak  # (a traced Python number's power stays one: see arithmetic.py)
    return passed


def zeros_made(result: Tensor) -> Tensor:
    """`result`, whose symbolic zero gradient (sgn's) is made zeros, as the backward in PyTorch
    of the operation that computed it makes zeros of a ZeroTensor (mean_backward's, mse_loss_backward's),
    though tracer's primitives for it would keep the symbolic zero."""
    return _zero_boundary(ZEROS_MADE, result, [])


def zero_kept(result: Tensor, *inputs) -> Tensor:
    """`result`, whose symbolic zero gradient goes to the tensors among `inputs` as it is, as the
    backward in PyTorch of the operation that computed it from them keeps a ZeroTensor (of mul,
    div and add, or views: cat's, dot's, tan's), though tracer's primitives for it would not."""
    return _zero_boundary(ZERO_KEPT, result, [t for t in inputs if isinstance(t, Tensor)])
