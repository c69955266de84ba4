"""VJP rules: the gradient of each primitive, written with the Builder vocabulary.

`VJP_RULES[primitive](b, g, z, inputs, needs, attributes)` gets the cotangent `g` of the result `z`
and returns one cotangent per operand (None where `needs` is False or no gradient flows). A rule may
return a cotangent in the broadcast result shape: `apply_vjp` sums it back to the operand's shape, so
broadcasting is handled here once, not in every rule.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Sequence

from tracer.ir.builder import Builder, Handle
from tracer.ir.primitives import (ELEMENTWISE, LINEAR, MULTIPLE_OUTPUTS, NON_DIFFERENTIABLE,
                                  PRIMITIVES, pad_as_slice, slice_as_pad)
from tracer.ir.types import TensorType, is_float


class CustomRule:
    """The user-written backward of a custom Function, attached to its `custom_vjp` instruction.

    `backward(builder, cotangents, needs)` returns one cotangent (or None) per Function input.
    Printed IR names a rule by its label; `CustomRule.live` finds it again when the text is parsed.
    """

    live: "weakref.WeakValueDictionary[str, CustomRule]" = weakref.WeakValueDictionary()
    _counter = itertools.count()

    def __init__(self, name: str, backward: Callable[[Builder, list, list[bool]], list],
                 runs_without_cotangents: bool = False, keeps_zero: bool = False,
                 elementwise: bool = False, sees_zero: bool = False):
        self.label = f"{name}.{next(self._counter)}"
        self.backward = backward
        # A user's Function runs its backward wherever the backward pass reaches it, even when no
        # gradient arrived (then with zeros, or None without materialize_grads), as PyTorch does.
        self.runs_without_cotangents = runs_without_cotangents
        # Whether PyTorch's backward of the operation keeps a ZeroTensor (see KEEPS_ZERO).
        self.keeps_zero = keeps_zero
        # Whether the backward is the same elementwise computation at any shape, so that vmap
        # runs one call on the batch (ir/batching.py) rather than one per element.
        self.elementwise = elementwise
        # Whether the backward is given a ZERO cotangent as it is, to decide what it makes of it.
        self.sees_zero = sees_zero
        CustomRule.live[self.label] = self

    def __repr__(self) -> str:
        return f"@{self.label}"


def _no_gradient(b, g, z, inputs, needs, attributes):
    return [None] * len(inputs)


class _Zero:
    """A gradient that is zero by construction (JAX's `Zero`, PyTorch's ZeroTensor): unlike None
    it is a gradient (autograd.grad returns zeros for it, not "unused"), unlike zeros it stays
    zero through every rule (zeros times a nan or an infinity would not)."""

    def __repr__(self) -> str:
        return "ZERO"


ZERO = _Zero()


def accumulate(b: Builder, previous: Handle | None, gradient: Handle | None) -> Handle | None:
    """The sum of two gradients of one value, either of which may be None (none flows) or ZERO."""
    if gradient is None or (gradient is ZERO and previous is not None):
        return previous
    if previous is None or previous is ZERO:
        return gradient
    return b.add(previous, gradient)


def materialize(b: Builder, gradient: Handle | None, type_: TensorType) -> Handle | None:
    """`gradient` as a value of `type_`: zeros for ZERO."""
    return b.full(type_.shape, 0, type_.dtype) if gradient is ZERO else gradient


def through_hooks(b: Builder, gradient: Handle, type_: TensorType,
                  run: Callable[[Handle], Handle]) -> Handle:
    """`run(gradient)` (the gradient hooks of a value, which see tensors): a symbolic zero is
    shown as zeros and stays symbolic if no hook replaces it."""
    if gradient is not ZERO:
        return run(gradient)
    zeros = materialize(b, gradient, type_)
    result = run(zeros)
    return ZERO if result is zeros else result


# The rule of PyTorch's sgn of a real tensor, whose gradient is a ZeroTensor: what sgn computes
# still requires grad, but no gradient flows back through it, so none meets a nan or an infinity
# on the way (zeros would: 0 * nan is nan). PyTorch's sign, by contrast, has zeros.
SGN = CustomRule("sgn", lambda builder, cotangents, needs: [ZERO], keeps_zero=True,
                 elementwise=True)


def sgn(b: Builder, x: Handle) -> Handle:
    """sign(x) with the gradient of PyTorch's sgn (a symbolic zero)."""
    (result,) = b.emit("custom_vjp", [b.op("sign", x), x], {"num_outputs": 1, "rule": SGN})
    return result


# Where one of tracer's primitives stands for several PyTorch operations whose backwards differ on
# a ZeroTensor, the operation's function (tracer/symbolic_zeros.py) passes its result through a
# custom_vjp of one of these identities (over the result, again as an operand, and the inputs).
def _zeros_made(builder, cotangents, needs):
    return [cotangents[0]]  # (ZERO made zeros by apply_vjp: keeps_zero is False)


def _zero_kept(builder, cotangents, needs):
    # a ZERO goes to the operation's inputs, not into its rules; any other gradient into them
    if cotangents[0] is ZERO:
        return [None] + [ZERO] * (len(needs) - 1)
    return [cotangents[0]] + [None] * (len(needs) - 1)


ZEROS_MADE = CustomRule("zeros_made", _zeros_made, elementwise=True)
ZERO_KEPT = CustomRule("zero_kept", _zero_kept, elementwise=True, sees_zero=True)


def _abs(b, g, z, inputs, needs, attributes):
    return [b.mul(g, sgn(b, inputs[0]))]  # PyTorch's abs_backward: grad * self.sgn()


def _div(b, g, z, inputs, needs, attributes):
    x, y = inputs
    return [b.div(g, y) if needs[0] else None,
            b.neg(b.div(b.mul(g, z), y)) if needs[1] else None]


def _pow(b, g, z, inputs, needs, attributes):
    # As PyTorch: d/dx is 0 where the exponent is 0; d/dy is 0 where x == 0 and y >= 0.
    x, y = inputs
    dx = dy = None
    if needs[0]:
        dx = b.select(b.eq(y, 0), 0.0, b.mul(g, b.mul(y, b.pow(x, b.sub(y, 1.0)))))
    if needs[1]:
        safe = b.logical_and(b.eq(x, 0), b.op("ge", y, b.constant(0, b.type_of(y).dtype)))
        dy = b.select(safe, 0.0, b.mul(g, b.mul(z, b.op("log", x))))
    return [dx, dy]


def _fmod(b, g, z, inputs, needs, attributes):
    # As PyTorch: d/dy is -g * trunc(x / y), trunc(q) = q - fmod(q, 1) (q itself if infinite)
    x, y = inputs
    dy = None
    if needs[1]:
        quotient = b.div(x, y)
        fraction = b.binary("fmod", quotient, 1.0)
        whole = b.select(b.op("ne", fraction, fraction), quotient, b.sub(quotient, fraction))
        dy = b.neg(b.mul(g, whole))
    return [g, dy]


def _mul(b, g, z, inputs, needs, attributes):
    x, y = inputs
    return [b.mul(g, y) if needs[0] else None, b.mul(g, x) if needs[1] else None]


def _maximum_like(select_first: str, select_second: str):
    # As PyTorch: ties split the gradient evenly between the operands, and an operand gets none
    # only where the other one wins, so both get all of it where either is nan (the result).
    def rule(b, g, z, inputs, needs, attributes):
        x, y = inputs
        gradient = b.select(b.eq(x, y), b.mul(g, 0.5), g)
        dx = b.select(b.op(select_second, x, y), 0.0, gradient)
        dy = b.select(b.op(select_first, x, y), 0.0, gradient)
        return [dx, dy]
    return rule


def _select(b, g, z, inputs, needs, attributes):
    condition = inputs[0]
    return [None,
            b.select(condition, g, 0.0) if needs[1] else None,
            b.select(condition, 0.0, g) if needs[2] else None]


def _cast(b, g, z, inputs, needs, attributes):
    return [b.cast(g, b.type_of(inputs[0]).dtype)]


def _reshape(b, g, z, inputs, needs, attributes):
    return [b.reshape(g, b.type_of(inputs[0]).shape)]


def _transpose(b, g, z, inputs, needs, attributes):
    permutation = attributes["permutation"]
    inverse = sorted(range(len(permutation)), key=lambda i: permutation[i])
    return [b.transpose(g, inverse)]


def _slice(b, g, z, inputs, needs, attributes):
    return [b.op("pad", g, **slice_as_pad(b.type_of(inputs[0]).shape, attributes["starts"],
                                          attributes["stops"], attributes["steps"]))]


def _pad(b, g, z, inputs, needs, attributes):
    return [b.op("slice", g, **pad_as_slice(b.type_of(inputs[0]).shape, attributes["low"],
                                            attributes["interior"]))]


def _reduce_sum(b, g, z, inputs, needs, attributes):
    return [b.broadcast_reduced(g, b.type_of(inputs[0]).shape, attributes["axes"])]


def _reduce_extremum(b, g, z, inputs, needs, attributes):
    # reduce_max and reduce_min, as PyTorch's full max() and min(): the gradient is shared evenly
    # between the elements equal to the result (tied maxima or minima).
    (x,) = inputs
    shape, axes = b.type_of(x).shape, attributes["axes"]
    dtype = b.type_of(x).dtype
    is_max = b.cast(b.eq(x, b.broadcast_reduced(z, shape, axes)), dtype)
    count = b.broadcast_reduced(b.reduce_sum(is_max, axes), shape, axes)
    return [b.div(b.mul(b.broadcast_reduced(g, shape, axes), is_max), count)]


def _matmul(b, g, z, inputs, needs, attributes):
    x, y = inputs
    return [b.op("matmul", g, b.swap_last_axes(y)) if needs[0] else None,
            b.op("matmul", b.swap_last_axes(x), g) if needs[1] else None]


def _gather(b, g, z, inputs, needs, attributes):
    # The gradient goes back to the positions read; repeated indices add up (PyTorch's index
    # backward is an index_put_ with accumulate=True).
    x, *indices = inputs
    return [b.op("scatter", b.zeros_like(x), g, *indices, axes=attributes["axes"],
                 accumulate=True)] + [None] * len(indices)


def _scatter(b, g, z, inputs, needs, attributes):
    # Accumulating: the target's gradient passes unchanged; overwriting: it is 0 where a value
    # was written. Each update gets the gradient of the position it went to (also the updates of
    # a repeated index that another one overwrote, as in PyTorch's index_put_ backward).
    target, updates, *indices = inputs
    axes = attributes["axes"]
    d_target = None
    if needs[0]:
        d_target = g if attributes["accumulate"] else b.op(
            "scatter", g, b.zeros_like(updates), *indices, axes=axes, accumulate=False)
    d_updates = b.op("gather", g, *indices, axes=axes) if needs[1] else None
    return [d_target, d_updates] + [None] * len(indices)


def _all_reduce(b, g, z, inputs, needs, attributes):
    # Every process's result is the sum over processes, so each operand's gradient is the sum of
    # every process's cotangent (torch.distributed.nn's all_reduce); for max and min it goes to
    # the elements equal to the result.
    (x,) = inputs
    total = b.op("all_reduce", g, op="sum")
    if attributes["op"] == "sum":
        return [total]
    return [b.select(b.eq(x, z), total, b.zeros_like(x))]


def _custom_vjp(b, cotangents, outputs, inputs, needs, attributes):
    count = attributes["num_outputs"]
    gradients = attributes["rule"].backward(b, list(cotangents), list(needs[count:]))
    return [None] * count + list(gradients)


def _host_callback(b, cotangents, outputs, inputs, needs, attributes):
    # A Function's callbacks get their gradients from its backward (custom_vjp): a gradient asked
    # of one itself is of a backward that runs on the host, which is not differentiable again.
    raise attributes["callback"].gradient_error()


def _table() -> dict[str, Callable[..., list]]:
    table: dict[str, Callable[..., list]] = dict.fromkeys(NON_DIFFERENTIABLE, _no_gradient)
    simple = {
        "neg": lambda b, g, z, x: [b.neg(g)],
        "sign": lambda b, g, z, x: [b.zeros_like(x)],  # zero almost everywhere, as in PyTorch
        "exp": lambda b, g, z, x: [b.mul(g, z)],
        "log": lambda b, g, z, x: [b.div(g, x)],
        "sqrt": lambda b, g, z, x: [b.div(g, b.mul(z, 2.0))],
        "tanh": lambda b, g, z, x: [b.mul(g, b.sub(1.0, b.mul(z, z)))],
        "sin": lambda b, g, z, x: [b.mul(g, b.op("cos", x))],
        "cos": lambda b, g, z, x: [b.neg(b.mul(g, b.op("sin", x)))],
        "add": lambda b, g, z, x, y: [g, g],
        "sub": lambda b, g, z, x, y: [g, b.neg(g)],
        "broadcast": lambda b, g, z, x: [g],
    }
    for name, rule in simple.items():
        table[name] = lambda b, g, z, inputs, needs, attributes, _rule=rule: _rule(b, g, z, *inputs)
    table.update({
        "abs": _abs, "mul": _mul, "div": _div, "pow": _pow, "fmod": _fmod,
        "maximum": _maximum_like("gt", "lt"), "minimum": _maximum_like("lt", "gt"),
        "select": _select, "cast": _cast, "reshape": _reshape, "transpose": _transpose,
        "slice": _slice, "pad": _pad, "reduce_sum": _reduce_sum, "reduce_max": _reduce_extremum,
        "reduce_min": _reduce_extremum,
        "matmul": _matmul, "all_reduce": _all_reduce, "custom_vjp": _custom_vjp,
        "host_callback": _host_callback, "gather": _gather, "scatter": _scatter,
    })
    return table


VJP_RULES = _table()
assert set(VJP_RULES) == PRIMITIVES, set(VJP_RULES) ^ PRIMITIVES

# VALUES_READ[primitive](needs) -> (which operands, whether the result) its VJP rule above reads
# to compute the gradients `needs`: an in-place change of such a value between the forward and
# the backward is refused (tracer/autograd.py, tracer/backward.py), as PyTorch refuses a change
# of a saved tensor.
def _reads(operands: bool | str, result: bool = False) -> Callable[[list[bool]], tuple]:
    """A row: every operand read (True) or none (False), or "other": operand i read when the other
    one needs its gradient (a product)."""
    def read(needs: list[bool]) -> tuple[list[bool], bool]:
        reads = [needs[1], needs[0]] if operands == "other" else [operands] * len(needs)
        return reads, result
    return read


def _indices_of(data_operands: int) -> Callable[[list[bool]], tuple]:
    """A gather's or scatter's row: only the index operands, which say where the gradient goes."""
    return lambda needs: ([False] * data_operands + [True] * (len(needs) - data_operands), False)


VALUES_READ: dict[str, Callable[[list[bool]], tuple]] = {
    **dict.fromkeys(NON_DIFFERENTIABLE, _reads(True)),
    **dict.fromkeys(LINEAR, _reads(False)),  # their gradient needs no value
    **dict.fromkeys(("abs", "sign", "log", "sin", "cos", "maximum", "minimum", "fmod"),
                    _reads(True)),
    **dict.fromkeys(("exp", "sqrt", "tanh"), _reads(False, True)),  # their result alone
    "select": lambda needs: ([True, False, False], False),  # the condition: where it goes
    "mul": _reads("other"), "matmul": _reads("other"),
    "div": lambda needs: ([False, True], needs[1]),
    "pow": lambda needs: ([True, True], needs[1]),
    "reduce_max": _reads(True, True), "reduce_min": _reads(True, True),
    "gather": _indices_of(1), "scatter": _indices_of(2),
    "all_reduce": _reads(True, True),
    "host_callback": _reads(False),  # its rule refuses
}
assert set(VALUES_READ) == PRIMITIVES, set(VALUES_READ) ^ PRIMITIVES


# Where PyTorch's ZeroTensor outlives a backward formula: its mul, div and add kernels, its views,
# sum and amax keep one; every other kernel (tanh_backward, threshold_backward, where, mm, neg,
# slice_backward, the sum of a broadcast operand's gradient, ...) makes zeros of it (measured with
# torch 2.13). Per primitive, the operands whose gradient stays ZERO when every cotangent is ZERO
# (an elementwise operand only if not broadcast); every other gradient is its rule's on zeros, so a
# nan or an infinity further back makes nan, as in PyTorch. (Where one primitive stands for
# PyTorch operations that differ, as mean's division or x ** 2's pow, it follows the first: see
# docs/findings.md, F33.)
KEEPS_ZERO = {"mul": (0, 1), "add": (0, 1), "sub": (0,), "div": (0,), "fmod": (0,), "pow": (1,),
              **dict.fromkeys(("exp", "log", "sqrt", "sin", "cos", "abs", "reshape", "transpose",
                               "reduce_sum", "reduce_max", "reduce_min", "all_reduce"), (0,))}


def _keeps_zero(b: Builder, primitive: str, attributes: dict[str, Any], inputs: Sequence[Handle],
                outputs: Sequence[Handle]) -> list[bool]:
    """Per operand, whether its gradient stays ZERO when every cotangent is ZERO."""
    if primitive == "custom_vjp":
        return [attributes["rule"].keeps_zero] * len(inputs)
    keeping = KEEPS_ZERO.get(primitive, ())
    shape = b.type_of(outputs[0]).shape
    return [index in keeping and (primitive not in ELEMENTWISE or b.type_of(x).shape == shape)
            for index, x in enumerate(inputs)]


def apply_vjp(b: Builder, primitive: str, attributes: dict[str, Any], inputs: Sequence[Handle],
              outputs: Sequence[Handle], cotangents: Sequence[Handle | None],
              needs: Sequence[bool]) -> list[Handle | None]:
    """Cotangents of `inputs`, given those of `outputs` (None: none flows; ZERO: a symbolic zero).
    Integer and bool operands get None; a cotangent in a broadcast shape is summed back to its
    operand's shape."""
    needs = [need and is_float(b.type_of(x).dtype) for need, x in zip(needs, inputs)]
    runs_anyway = primitive == "custom_vjp" and attributes["rule"].runs_without_cotangents
    sees_zero = primitive == "custom_vjp" and attributes["rule"].sees_zero
    flowing = [g for g in cotangents if g is not None]
    if not any(needs) or (not flowing and not runs_anyway):
        return [None] * len(inputs)
    kept = [False] * len(inputs)
    if sees_zero:
        results = VJP_RULES[primitive](b, cotangents, outputs, list(inputs), needs, attributes)
        return [gradient if need else None for need, gradient in zip(needs, results)]
    if all(g is ZERO for g in flowing) and not runs_anyway:  # zero in, zero out where PyTorch's is
        kept = [need and keep for need, keep in
                zip(needs, _keeps_zero(b, primitive, attributes, inputs, outputs))]
        needs = [need and not keep for need, keep in zip(needs, kept)]
        if not any(needs):
            return [ZERO if keep else None for keep in kept]
    # (a rule, a user's backward among them, sees zeros: PyTorch materializes them too)
    cotangents = [materialize(b, g, b.type_of(z)) for g, z in zip(cotangents, outputs)]
    rule = VJP_RULES[primitive]
    if primitive in MULTIPLE_OUTPUTS:
        results = rule(b, cotangents, outputs, list(inputs), needs, attributes)
    else:
        results = rule(b, cotangents[0], outputs[0], list(inputs), needs, attributes)
    gradients: list[Handle | None] = []
    for need, keep, x, gradient in zip(needs, kept, inputs, results):
        if keep:
            gradients.append(ZERO)
        elif not need or gradient is None or gradient is ZERO:
            gradients.append(gradient if need else None)
        else:
            gradients.append(b.sum_to_shape(gradient, b.type_of(x).shape))
    return gradients
