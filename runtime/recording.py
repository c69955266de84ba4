"""Tracing one call of a function: a proxy tensor for every argument leaf, the function run on them
(with the tensors it reads from outside captured, see Trace.capture), and what it changed of its
arguments and captured tensors, to be written back after each call. The pipeline
(runtime/pipeline.py) runs the autodiff pass inside the same recording context."""
from __future__ import annotations

import contextlib
import numbers
import re
from typing import Any, Callable, Sequence

import numpy as np

from tracer import ir
from tracer.runtime.arguments import flatten, parameter_name
from tracer.runtime.floats import FloatInput, RuntimeFloats, decide
from tracer.runtime.code_names import recording_names
from tracer.runtime.random_draws import Draws
from tracer.runtime.guards import captured_names, stored_tensors
from tracer.runtime.reach import Reached, reachable
from tracer.backward import backward_reads_a_change
from tracer.context import noting_absent_reads
from tracer.errors import ArgumentError, SpecializationNeeded, TracingError
from tracer.creation import from_numpy
from tracer.tensor import Tensor, check_current
from tracer.tracing import Trace, tracing


class Recording:
    """A traced call, its gradients expanded. (A plain class: @dataclass generating its methods
    took ~2 ms of a fresh process's tr.trace, which imports this module.)"""

    def __init__(self, function: ir.Graph, result_structure: tuple, result_leaves: list,
                 writebacks: list[tuple[int, str, int]], cleared: list[int], unread: list[int],
                 sources: list[tuple[str, int]], captured: list[Tensor], reached: Reached,
                 used: set[str] | None, floats: list[FloatInput], rules: list,
                 aliases: list[tuple[int, int, str]], views: list[tuple[int, int, str, str, bool]],
                 repeats: list[tuple[int, int]], stale: frozenset[int], replayed: frozenset[int],
                 replays_backward: bool):
        self.function = function
        self.result_structure = result_structure
        self.result_leaves = result_leaves  # the result's leaves, traced
        # (leaf index, "data" | "grad", output index) for every value written back; leaf indices
        # past the arguments' leaves are the captured tensors'
        self.writebacks = writebacks
        self.cleared = cleared  # leaves whose .grad the function set to None
        self.unread = unread  # leaves whose .grad on entry the function did not read
        self.sources = sources  # where each parameter comes from (see Entry)
        self.captured = captured
        self.reached = reached  # what the function could reach before tracing
        self.used = used  # the names of the code run while tracing (see guards_for)
        self.floats = floats  # floats read from outside: parameters after the captured ones
        self.rules = rules  # custom rules the traced text names
        # results that are an argument's or captured tensor's stand-in, its .grad or a detach()
        # of it, and results that are view-copies of one (Trace.result_relations)
        self.aliases = aliases
        self.views = views
        # (result position, earlier position): the same traced tensor returned again
        self.repeats = repeats
        # results not differentiated after the call, and the leaves whose data on entry their
        # backward reads (see result_dependence)
        self.stale = stale
        self.replayed = replayed
        # whether the backward must run the function again: it registered gradient hooks
        # (register_hook), or changed in place a value its backward reads
        # (tracer.backward.backward_reads_a_change)
        self.replays_backward = replays_backward


class Specialize(Exception):
    """Trace again with the int arguments at these paths, and the floats read from outside at
    these paths (named as guards name them), static."""

    def __init__(self, paths: frozenset[str], floats: frozenset[str] = frozenset(),
                 why: str = "the trace needs their Python values"):
        super().__init__(", ".join(sorted(paths | floats)))
        self.paths, self.floats, self.why = paths, floats, why


class Recorder:
    """One call of a function traced on proxies of its argument `leaves` ((value, path) pairs),
    which `rebuild(proxies)` turns into its (args, kwargs); `static_objects` are the named
    arguments that are objects. The floats it reads from outside are runtime inputs
    (runtime/floats.py) but those named in `static_floats`.

    A context manager: inside it, `trace()` runs the function and `expand_gradients()` the
    autodiff pass, in the same tracing context (a custom backward traced by the autodiff pass may
    capture tensors too); after it, `recording` holds what the trace found. `trace()` raises
    Specialize when an int argument or such a float must be static."""

    def __init__(self, function: Callable, name: str, leaves: Sequence, rebuild: Callable,
                 static_objects: Sequence[tuple[str, Any]],
                 static_floats: frozenset[str] = frozenset()):
        self.function, self.leaves, self.rebuild = function, leaves, rebuild
        self.static_objects = static_objects
        self.trace_state = Trace(name if name.isidentifier() else "function")
        self.reached = reachable(function, static_objects)
        self.floats = RuntimeFloats(self.trace_state, self.reached.floats(), static_floats)
        self.trace_state.decider = lambda value: decide(self.trace_state, value)
        self.sources: list[tuple[str, int]] = []
        self.contexts = contextlib.ExitStack()
        self.recording: Recording | None = None
        self._traced: ir.Graph | None = None

    def __enter__(self) -> "Recorder":
        self.contexts.enter_context(tracing(self.trace_state))
        self.contexts.enter_context(noting_absent_reads(self.reached.absent_reads))
        self.used = self.contexts.enter_context(recording_names())
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            self.floats.restore()
            self.trace_state.release()
        finally:
            self.contexts.close()
        if error is None:
            self.recording = self._finish()

    def trace(self) -> ir.Graph:
        """The function's primitives (the `traced` stage). (Unverified: the pipeline verifies the
        optimized graph it compiles, and the tests every stage's printed text.)"""
        trace, leaves, floats = self.trace_state, self.leaves, self.floats
        proxies: list = []
        seen: dict[int, Any] = {}
        for index, (value, path) in enumerate(leaves):
            if id(value) in seen and not isinstance(value, numbers.Number):
                proxies.append(seen[id(value)])
                continue
            proxy, kinds = trace.add_argument(value, parameter_name(path), index)
            self.sources += [(kind, index) for kind in kinds]
            seen[id(value)] = proxy
            proxies.append(proxy)
        args, kwargs = self.rebuild(proxies)
        floats.substitute()
        draws = Draws(self.reached.generators.values())
        trace.draws_undone = draws.undone

        def drawn() -> str | None:  # (puts back what the function drew: see Draws.drawn)
            # (a copy in one step: the set grows while it is read -- the code reading it is
            # recorded too -- and iterating it would then fail)
            return draws.drawn(self.used.codes.copy() if self.used is not None else None)

        try:
            result = self.function(*args, **kwargs)
        except SpecializationNeeded as error:
            drawn()  # the function runs again, and draws again
            raise _specialization(trace, error, leaves, proxies, floats.inputs) from None
        except Exception as error:
            if not floats.inputs:
                raise
            drawn()
            # perhaps code that takes a float and not a tensor: trace again with the floats as
            # constants (if that fails too, its error is the user's)
            raise Specialize(frozenset(), frozenset(i.name for i in floats.inputs),
                             f"tracing with them as runtime inputs raised {error!r}") from error
        generator = drawn()
        if generator is not None:
            raise TracingError(f"the traced function drew random numbers from {generator} while it "
                               f"was traced: they would be compiled in, the same on every call. "
                               f"Draw them outside and pass them as an argument, or draw them "
                               f"inside with tracer's generator, which draws new ones on every "
                               f"call: tr.randn_like(x), tr.rand(shape), .normal_(), nn.Dropout")
        rebound = floats.rebound()
        if rebound:  # as an int would be: compiled in, and its change seen while tracing
            raise Specialize(frozenset(), rebound, "the traced function changes them")
        result_leaves: list = []
        self.result_structure = flatten(result, result_leaves, "result")
        self.result_leaves = [value for value, _ in result_leaves]
        outputs = [_result_value(trace, value) for value in self.result_leaves]
        traced = self._traced = trace.function
        traced.outputs = outputs
        # (before settle: a written-back value may be a float's parameter itself, `x.fill_(c)`
        # of a 0-d tensor with a runtime float c, which must not be dropped as unread)
        self.writebacks, self.cleared, self.unread = trace.writebacks(outputs, len(leaves))
        exponents = floats.exponents(traced)
        if exponents:
            raise Specialize(frozenset(), exponents, "they are exponents of powers")
        floats.settle(traced)
        floats.restore()  # (a custom backward traced by the autodiff pass reads constants)
        _check_nothing_stored(trace, reachable(self.function, self.static_objects))
        self.repeats = _repeats(self.result_leaves)
        repeated = {position for position, _ in self.repeats}
        aliases, views = trace.result_relations(self.result_leaves, len(leaves))
        self.aliases = [alias for alias in aliases if alias[0] not in repeated]
        self.views = [view for view in views if view[0] not in repeated]
        _name_captured(traced, trace.captured, self.reached)
        floats.order(traced)
        # The traced text names custom rules (@MyReLU.0) that parse back only while they are
        # alive; the autodiff pass drops them from the graph, so the entry keeps them.
        self.rules = [i.attributes["rule"] for i in traced.instructions
                      if isinstance(i.attributes.get("rule"), ir.CustomRule)]
        return traced

    def expand_gradients(self) -> ir.Graph:
        """The traced function with its gradient directives replaced by the autodiff pass (the
        `grad` stage; unverified, as the `traced` one)."""
        ir.expand_gradients(self._traced)
        self.floats.order(self._traced)
        return self._traced

    def _finish(self) -> Recording:
        leaves, captured = self.leaves, self.trace_state.captured
        sources = list(self.sources)
        for k, entry in enumerate(captured):
            sources += [("leaf", len(leaves) + k)] + [("grad", len(leaves) + k)] * (
                entry.grad is not None)
        first_float = len(leaves) + len(captured)
        sources += [("leaf", first_float + k) for k in range(len(self.floats.inputs))]
        stale, replayed = result_dependence(
            self._traced, sources, self.writebacks, self.cleared,
            _requiring_grad([*(value for value, _ in leaves), *(c.tensor for c in captured)]),
            _requiring_grad(self.result_leaves))
        return Recording(self._traced, self.result_structure, self.result_leaves,
                         self.writebacks, self.cleared, self.unread, sources,
                         [c.tensor for c in captured], self.reached, self.used,
                         self.floats.inputs, self.rules, self.aliases, self.views, self.repeats,
                         stale, replayed,
                         any(self.trace_state.gradient_hooks.values())
                         or backward_reads_a_change(self.trace_state, self.result_leaves, stale))


def _repeats(results: Sequence) -> list[tuple[int, int]]:
    """(position, earlier position) of every result tensor returned again: the call returns one
    tensor there, as eager mode and torch.compile do (`y = x * 2; return y, y`)."""
    first: dict[int, int] = {}
    repeats = []
    for position, value in enumerate(results):
        earlier = first.setdefault(id(value), position)
        if earlier != position and isinstance(value, Tensor):
            repeats.append((position, earlier))
    return repeats


def _requiring_grad(values: Sequence) -> list[bool]:
    return [isinstance(value, Tensor) and value.requires_grad for value in values]


def result_dependence(function: ir.Graph, sources: Sequence[tuple[str, int]],
                      writebacks: Sequence[tuple[int, str, int]], cleared: Sequence[int],
                      requires_grad: Sequence[bool], results_requiring_grad: Sequence[bool]
                      ) -> tuple[frozenset[int], frozenset[int]]:
    """(stale, replayed): the positions of the results that are not differentiated after the
    call, and the leaves whose data as it was on entry the backward needs (`requires_grad`: of
    each leaf; `results_requiring_grad`: of each result).

    The backward runs the function again after the call (runtime/differentiable.py), on the data
    the call overwrites as the call found it (replayed). A result of a function that changes a
    .grad (a training step, which calls backward inside: its graph is used up, as PyTorch's) is
    stale, as is one computed from a tensor that requires grad as it was before the call changed
    it in place (an update after the forward, after which PyTorch's backward raises). One computed
    from such a tensor only as changed (weights clipped in place, then used) is replayed, as is
    one computed from other data the call overwrites (the random generator's counter, a buffer)."""
    if cleared or any(kind != "data" for _, kind, _ in writebacks):
        return frozenset(range(len(results_requiring_grad))), frozenset()
    written = {("leaf", index): index for index, _, _ in writebacks}
    index_of = {id(parameter): written[source]
                for parameter, source in zip(function.parameters, sources) if source in written}
    changed = {id(function.outputs[output]) for _, _, output in writebacks}
    stale, replayed = set(), set()
    if not index_of:
        return frozenset(), frozenset()
    for position, value in enumerate(function.outputs[:len(results_requiring_grad)]):
        if not results_requiring_grad[position]:
            continue  # (never differentiated)
        # the written leaves the result reads: a walk back through its producers, noting
        # whether the path went through a value the call writes back (the leaf as changed)
        before, seen, stack = set(), {(id(value), False)}, [(value, False)]
        while stack:
            value, as_changed = stack.pop()
            as_changed = as_changed or id(value) in changed
            if id(value) in index_of:
                replayed.add(index_of[id(value)])
                if not as_changed:
                    before.add(index_of[id(value)])
            elif value.producer is not None:
                for operand in value.producer.inputs:
                    if (id(operand), as_changed) not in seen:
                        seen.add((id(operand), as_changed))
                        stack.append((operand, as_changed))
        if any(requires_grad[index] for index in before):
            stale.add(position)
    # (a stale result needs nothing replayed; the others' leaves are all that is)
    return frozenset(stale), frozenset(replayed) if len(stale) < sum(results_requiring_grad) \
        else frozenset()


def _name_captured(function: ir.Graph, captured: list, reached: Reached) -> None:
    """Name the parameters of captured tensors after the first path to them (%self_layer_w)."""
    taken = {value.name for value in function.parameters}
    for entry, name in zip(captured, captured_names(reached, [c.tensor for c in captured])):
        name = re.sub(r"\W+", "_", name.removeprefix("global ").removeprefix(
            "closure variable ")).strip("_")
        grad_name = f"{name}_grad"
        if entry.constant or name in taken or grad_name in taken or not name.isidentifier():
            continue
        taken.update((name, grad_name))
        entry.value.name = name
        if entry.grad is not None:
            entry.grad.name = grad_name


def _result_value(trace: Trace, value):
    if isinstance(value, Tensor):
        check_current(value)
        return trace.handle_of(value)
    if isinstance(value, np.ndarray):
        return trace.handle_of(from_numpy(value))
    raise ArgumentError(f"a traced function returns tensors (or static values), "
                        f"got a {type(value).__name__}; return it as a tensor")


def _check_nothing_stored(trace: Trace, reached: Reached) -> None:
    stored = stored_tensors(reached, trace, [c.tensor for c in trace.captured if not c.constant])
    if stored:
        raise TracingError(
            f"the traced function stored tensors it computed in "
            f"{', '.join(path for path, _ in stored)}; the compiled code cannot store them there "
            f"on later calls. Create such state before the call (in __init__, or by one eager "
            f"call) and update it in place (.copy_(), .mul_(), ...), or return the tensors. "
            f"(This trace left them there: take them out.)",
            line=trace.location_of(stored[0][1]))  # the line that made the first one


def _specialization(trace: Trace, error: SpecializationNeeded, leaves: Sequence,
                    proxies: Sequence, floats: Sequence[FloatInput]) -> Exception:
    """What to do when the trace needed the Python value of a traced tensor: if it is computed
    from number arguments and floats read from outside alone, trace again with the int arguments
    and those floats static, or, if float arguments are among them, an error that names them;
    else (it depends on tensors) the error itself."""
    sources, stack, seen = set(), [error.value], set()
    while stack:  # the parameters the value was computed from
        value = stack.pop()
        if id(value) not in seen:
            seen.add(id(value))
            if value.producer is None:
                sources.add(id(value))
            else:
                stack += value.producer.inputs
    used = [(value, path) for (value, path), proxy in zip(leaves, proxies)
            if isinstance(value, numbers.Number) and id(trace.handle_of(proxy)) in sources]
    outside = frozenset(i.name for i in floats if id(i.parameter) in sources)
    if not (used or outside) or len(used) + len(outside) < len(sources):
        return error
    floats = [path for value, path in used if not isinstance(value, numbers.Integral)]
    if not floats:
        return Specialize(frozenset(path for _, path in used), outside)
    return TracingError(
        f"{error.what} needs the value of the float argument {', '.join(floats)}, a Python "
        f"number passed to the traced function, which is a runtime input; name its position in "
        f"tr.trace(f, static_argnums=...) to bake it in (one compilation per value)",
        line=error.line)
