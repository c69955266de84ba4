"""Custom Functions that compute on the host (NumPy, SciPy) inside `@trace`: host callbacks.

A Function whose forward reads the values of its tensors (`.numpy()`, `np.asarray(t)`,
`.item()`) cannot be traced into primitives: under `@trace` it becomes a `host_callback`
instruction (ir/host.py), which the compiled step calls back into Python for while the rest of the
step stays compiled and fused (JAX's `pure_callback`). Its forward runs there as it runs eagerly,
on tensors holding the values of that call; its backward is a second callback, given the `ctx` of
the forward run of the same call (so `ctx.save_for_backward`, ctx attributes and
`needs_input_grad` are as in eager mode), behind a `custom_vjp` like any Function's. A Function
whose forward is traced but whose backward reads values gets only the backward callback: its
saved tensors and tensor attributes of ctx are its operands.

The result types of the forward come from running it once while tracing, on the values its
inputs have in the call being traced (or, where those cannot be computed, seeded random values);
a later call whose forward returns other shapes or dtypes raises HostCallbackError naming the
line that applied the Function, and, as for any failing call, leaves the arguments unchanged
(runtime/compiled.py). Non-tensor outputs keep the values of the traced run. A backward on the
host is not differentiable again (a second-order gradient through it is refused), and a forward
on the host may not change its inputs in place (ctx.mark_dirty).
"""
from __future__ import annotations

import copy
import threading
from typing import Callable

import numpy as np

from tracer.ir.builder import ArrayBuilder
from tracer.ir.graph import Instruction, Value
from tracer.ir.host import HostCallback
from tracer.ir.primitives import IndexRangeError
from tracer.ir.reference import evaluate_primitive
from tracer.ir.types import TensorType, is_float
from tracer.ir.vjp import CustomRule
from tracer.context import is_grad_enabled, no_grad
from tracer.errors import HostCallbackError, IndexOutOfRangeError, definition_line, user_line
from tracer.function_rule import FunctionRule
from tracer.tensor import Tensor
from tracer.tracing import tracing


def evaluate_call_values(instruction: Instruction, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`instruction`'s results on this call's values of its inputs, by the reference semantics,
    while compiling (to trace a callback's forward here, to find a Function's inputs for
    runtime/check_grads.py). An index outside its dimension is IndexOutOfRangeError at the user's
    line that indexed (the reference's own error names none), not a fallback to drawn values:
    the code compiled from them would serve later calls (keeping a forward's non-tensor outputs
    of them, or never checking a backward at real values)."""
    try:
        return evaluate_primitive(instruction.primitive, inputs, instruction.attributes)
    except IndexRangeError as error:
        raise IndexOutOfRangeError(str(error), instruction.location or None) from None


def sample_values(trace, handles: list[Value]) -> list[np.ndarray]:
    """The values `handles` have in the call being traced, computed by the reference semantics
    from the parameters' values; seeded random values (zeros for integers and bools) where they
    depend on what cannot be evaluated yet (a gradient not yet expanded)."""
    needed, stack, seen = [], list(handles), set()
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if value.producer is not None:
            needed.append(value.producer)
            stack.extend(value.producer.inputs)
    known = dict(trace.parameter_values)
    known.update((key, entry.value) for key, entry in trace.float_inputs.items())
    order = {id(instruction): n for n, instruction in enumerate(trace.function.instructions)}
    environment: dict[int, np.ndarray] = {}
    try:
        for instruction in sorted(set(needed), key=lambda i: order.get(id(i), -1)):
            for operand in instruction.inputs:
                if operand.producer is None:
                    environment[id(operand)] = np.asarray(known[id(operand)], operand.dtype)
            results = evaluate_call_values(instruction,
                                           [environment[id(v)] for v in instruction.inputs])
            environment.update(zip(map(id, instruction.outputs), results))
        return [environment[id(h)] if h.producer is not None
                else np.asarray(known[id(h)], h.dtype) for h in handles]
    except IndexOutOfRangeError:  # (a ValueError too, but no reason to draw samples)
        raise
    except (KeyError, ValueError, TypeError):  # a parameter of unknown value, a directive
        random = np.random.default_rng(0)
        return [random.standard_normal(h.shape).astype(h.dtype) if is_float(h.dtype)
                else np.zeros(h.shape, h.dtype) for h in handles]


class HostFunction:
    """One application of a Function whose forward runs on the host, traced: its callbacks and
    what the forward returned when traced."""

    def __init__(self, name: str, forward: Callable, backward: Callable, make_ctx: Callable,
                 arguments: list, given: int):
        self.name, self.forward, self.backward = name, forward, backward
        self.make_ctx, self.given = make_ctx, given
        self.arguments = arguments  # the traced arguments: tensors are replaced on each run
        self.line = user_line()
        self.runs = threading.local()  # .rule: the backward of this thread's last forward run
        self.structure: list = []  # per output: its TensorType, or the value of a non-tensor
        self.multiple = False  # whether forward returned a tuple

    def _eager_arguments(self, arrays) -> list:
        values = iter(arrays)
        return [Tensor._make(next(values), None, a.requires_grad, leaf=True)
                if isinstance(a, Tensor) else a for a in self.arguments]

    def run_forward(self, *arrays: np.ndarray) -> tuple[list, FunctionRule]:
        """The user's forward on tensors of `arrays` (eagerly, gradients off), and the rule that
        runs its backward with the ctx it filled."""
        with tracing(None), no_grad():
            arguments = self._eager_arguments(arrays)
            ctx = self.make_ctx()
            raw = self.forward(ctx, *arguments)
        self.multiple = isinstance(raw, (tuple, list))
        outputs = list(raw) if self.multiple else [raw]
        if ctx._dirty:
            raise HostCallbackError(
                f"{self.name}.forward reads tensor values (it runs on the host under @tr.trace) "
                f"and changes an input in place (ctx.mark_dirty); return a new tensor instead",
                self.line)
        ctx._saved_versions = [t._version if isinstance(t, Tensor) else 0 for t in ctx._saved]
        ctx._saved_bases = [None] * len(ctx._saved)
        differentiable = [is_float(o.dtype) and not any(o is n for n in ctx._non_differentiable)
                          for o in outputs if isinstance(o, Tensor)]
        rule = FunctionRule(self.name, self.forward, self.backward, ctx, arguments, outputs,
                            differentiable, None, self.given)
        return outputs, rule

    def traced_run(self, arrays: list[np.ndarray]) -> list[bool]:
        """Run once while tracing: which tensor outputs are differentiable."""
        outputs, rule = self.run_forward(*arrays)
        self.structure = [TensorType(o.shape, o.dtype) if isinstance(o, Tensor) else o
                          for o in outputs]
        return [entry[2] for entry in rule.outputs if entry is not None]

    def forward_callback(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """The callback of the forward: its tensor outputs, checked against the traced run's."""
        outputs, rule = self.run_forward(*arrays)
        if len(outputs) != len(self.structure):
            raise HostCallbackError(
                f"{self.name}.forward returned {len(outputs)} output(s) where it returned "
                f"{len(self.structure)} when traced", self.line)
        results = []
        for place, (output, traced) in enumerate(zip(outputs, self.structure)):
            if not isinstance(traced, TensorType):
                continue
            if not isinstance(output, Tensor) or output.shape != traced.shape or (
                    output.dtype != traced.dtype):
                got = (f"shape {list(output.shape)} and dtype {output.dtype}"
                       if isinstance(output, Tensor) else f"a {type(output).__name__}")
                raise HostCallbackError(
                    f"{self.name}.forward (run on the host under @tr.trace) returned {got} as "
                    f"output {place}, where it returned shape {list(traced.shape)} and dtype "
                    f"{traced.dtype} when traced; the compiled step is specialized to those. "
                    f"Return results of the same shape and dtype for inputs of one shape, or "
                    f"apply the Function outside the traced function", self.line)
            results.append(output._handle)
        self.runs.rule = rule
        return tuple(results)

    def rule_of_last_run(self, arrays: list) -> FunctionRule:
        """The backward of this thread's last forward run, which ran earlier in the same call
        (the backward callback has the forward's result as an operand)."""
        return self.runs.rule


def _not_differentiable(name: str, line: str) -> Callable[[], Exception]:
    return lambda: HostCallbackError(
        f"{name} runs on the host under @tr.trace (it reads tensor values), so it cannot be "
        f"differentiated again: a second-order gradient through it needs a Function written "
        f"with tensor operations", line)


def apply_on_host(name: str, forward: Callable, backward: Callable, make_ctx: Callable,
                  arguments: list, given: int, trace) -> object:
    """`Function.apply` under `@trace` for a forward that reads tensor values: a host callback
    (and a custom_vjp whose backward is another), returning what forward returns."""
    tensors = [a for a in arguments if isinstance(a, Tensor)]
    handles = [trace.handle_of(t) for t in tensors]
    host = HostFunction(name, forward, backward, make_ctx, arguments, given)
    with trace.draws_undone():  # (a forward that draws numbers draws them on every call)
        differentiable = host.traced_run(sample_values(trace, handles))
    callback = HostCallback(f"{name}.forward", host.forward_callback,
                            [h.type for h in handles],
                            [t for t in host.structure if isinstance(t, TensorType)],
                            _not_differentiable(f"{name}.forward", host.line))
    results = trace.builder.emit("host_callback", handles, {"callback": callback})
    recording = is_grad_enabled() and any(t.requires_grad for t in tensors)
    recorded = [r for r, d in zip(results, differentiable) if d]
    if recording and recorded:
        backward_rule = HostBackward(name, host.rule_of_last_run, recorded[:1],
                                     [h.type for h in handles], host.line)
        rule = CustomRule(name, backward_rule, runs_without_cotangents=True)
        made = iter(trace.builder.emit("custom_vjp", recorded + handles,
                                       {"num_outputs": len(recorded), "rule": rule}))
        results = [next(made) if d else r for r, d in zip(results, differentiable)]
    flags = iter(zip(results, differentiable))
    returned = []
    for traced in host.structure:
        if not isinstance(traced, TensorType):
            returned.append(traced)
            continue
        handle, flag = next(flags)
        grads = recording and flag
        returned.append(Tensor._make(handle, trace, grads, leaf=not grads))
    return tuple(returned) if host.multiple else returned[0]


class HostBackward:
    """The backward of a Function as a host callback: `__call__(builder, cotangents, needs)` (a
    CustomRule's backward, called by the autodiff pass) emits the callback, whose operands are
    `operands` (which order it after the forward run it needs, and hold what it reads) and the
    cotangents that flow; its results are the gradients of the inputs that need one."""

    def __init__(self, name: str, rule_of_run: Callable[[list], FunctionRule],
                 operands: list[Value], input_types: list[TensorType], line: str):
        self.name, self.rule_of_run = name, rule_of_run
        self.operands, self.input_types, self.line = operands, input_types, line

    def __call__(self, builder, cotangents: list, needs: list[bool]) -> list:
        if not any(needs):
            return [None] * len(needs)
        flowing = [c is not None for c in cotangents]
        count = len(self.operands)

        def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
            rule = self.rule_of_run(list(arrays[:count]))
            given = iter(arrays[count:])
            with tracing(None):
                gradients = rule(ArrayBuilder(), [next(given) if f else None for f in flowing],
                                 needs)
            return tuple(np.zeros(t.shape, t.dtype) if g is None else np.asarray(g, t.dtype)
                         for g, t, need in zip(gradients, self.input_types, needs) if need)

        callback = HostCallback(f"{self.name}.backward", run,
                                [*(v.type for v in self.operands),
                                 *(builder.type_of(c) for c in cotangents if c is not None)],
                                [t for t, need in zip(self.input_types, needs) if need],
                                _not_differentiable(f"{self.name}.backward", self.line))
        results = iter(builder.emit("host_callback", [*self.operands,
                                                      *(c for c in cotangents if c is not None)],
                                    {"callback": callback}))
        return [next(results) if need else None for need in needs]


def backward_on_host(rule: FunctionRule, builder, cotangents: list, needs: list[bool]) -> list:
    """The traced backward of a Function whose forward was traced but whose backward reads
    tensor values: a host callback given the saved tensors and the tensors kept as ctx
    attributes, which it puts in a copy of ctx as eager tensors."""
    ctx = rule.ctx
    attributes = [k for k, v in vars(ctx).items() if not k.startswith("_") and isinstance(v, Tensor)]
    saved = [i for i, h in enumerate(ctx._saved_handles) if h is not None]
    trace = rule.trace
    operands = [ctx._saved_handles[i] for i in saved] + [
        trace.handle_of(getattr(ctx, k)) for k in attributes]

    def rule_of_run(arrays: list) -> FunctionRule:
        eager_ctx = copy.copy(ctx)
        eager_ctx._trace, eager_ctx._saved_aliases = None, []
        eager_ctx._saved = list(ctx._saved)
        tensors = iter(Tensor._make(a, None, False) for a in arrays)
        for i in saved:
            eager_ctx._saved[i] = next(tensors)
        for k in attributes:
            setattr(eager_ctx, k, next(tensors))
        eager_ctx._saved_versions = [0] * len(eager_ctx._saved)
        eager_ctx._saved_bases = [None] * len(eager_ctx._saved)
        eager = copy.copy(rule)
        eager.ctx, eager.trace = eager_ctx, None
        eager.arguments = [Tensor._make(np.zeros(a.shape, a.dtype), None, False)
                           if isinstance(a, Tensor) else a for a in rule.arguments]
        return eager

    types = [TensorType(a.shape, a.dtype) for a in rule.arguments if isinstance(a, Tensor)]
    return HostBackward(rule.name, rule_of_run, operands, types,
                        definition_line(rule.user_backward))(builder, cotangents, needs)
