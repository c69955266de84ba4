"""The forward and backward of a signature whose results are differentiated (AOTAutograd's
scheme, ir/partition.py): the signature's code is the forward that also returns what the backward
reads (its residuals); the backward, compiled at the first backward, computes the gradients of the
call's inputs from the cotangents, those residuals and the parameters it reads."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from tracer.buffers import buffer_of, results
from tracer.host_function import HostBackward
from tracer.ir.partition import Split, Unsplittable, split
from tracer.ir.types import is_float
from tracer.tensor import Tensor

if TYPE_CHECKING:
    from tracer.ir.graph import Graph
    from tracer.runtime.recording import Recording


def gradient_inputs(leaves: Sequence, captured: Sequence[Tensor]) -> list[Tensor]:
    """The tensors a call's tape node sends gradients to: the argument leaves that require grad
    (each tensor once, in order), then the captured tensors that do."""
    return list({id(v): v for v in leaves if isinstance(v, Tensor) and v.requires_grad}.values()
                ) + [t for t in captured if t.requires_grad]


class SplitCode:
    """A signature's split: where the backward's parameters come from, which of its outputs is
    each input's gradient, and the backward's code (compiled when first needed)."""

    def __init__(self, parts: Split, wrt: list[tuple[str, int] | None], result_count: int,
                 sources: list[tuple[str, int]], compile_function: Callable[["Graph"], object]):
        self.sources = parts.sources
        self._graph, self._compile = parts.backward, compile_function
        self._code = None
        self._lock = threading.Lock()
        gradient_of = iter(parts.gradients)
        self.gradients = [None if position is None else next(gradient_of) for position in wrt]
        self.shapes = [p.shape for p in parts.backward.parameters]
        # results the backward reads: changing one in place before it is an error (as PyTorch's
        # tanh's output)
        self.saved_results = sorted({index for kind, index in self.sources
                                     if kind == "output" and index < result_count})
        self._outputs = sorted({index for kind, index in self.sources if kind == "output"})
        # the parameters the backward reads, and the leaf each comes from
        self._parameters = [index for kind, index in self.sources if kind == "parameter"]
        self.leaves = [sources[p][1] for p in self._parameters]

    def read(self, arrays: list[np.ndarray], values: list) -> list[np.ndarray]:
        """Of a call's `arrays`, those the backward reads; numpy arrays copied (the user may
        change them before the backward, and they have no version counter)."""
        return [arrays[p] if isinstance(values[leaf], Tensor) else arrays[p].copy()
                for p, leaf in zip(self._parameters, self.leaves)]

    def residuals(self, outputs: list[np.ndarray]) -> dict[int, np.ndarray]:
        """Of a call's forward `outputs`, those the backward reads, by index (the tape node
        keeps these alone: not a result the user dropped)."""
        return {index: outputs[index] for index in self._outputs}

    @property
    def backward(self):
        """The backward's compiled code (the first backward compiles it)."""
        with self._lock:
            if self._code is None:
                self._code = self._compile(self._graph)
            return self._code

    def gradients_of(self, parameters: list[np.ndarray], outputs: dict[int, np.ndarray],
                     cotangents: list[Tensor]) -> list[Tensor | None]:
        """The gradients of one call from its cotangents, its forward's `outputs` that the
        backward reads (`residuals`) and the `parameters` it reads (`read`)."""
        read = iter(parameters)
        arrays = []
        for (kind, index), shape in zip(self.sources, self.shapes):
            if kind == "cotangent":
                cotangent = buffer_of(cotangents[index])  # (the compiled code converts its type)
                arrays.append(cotangent if cotangent.shape == shape
                              else np.broadcast_to(cotangent, shape))
            elif kind == "output":
                arrays.append(outputs[index])
            else:
                arrays.append(next(read))
        code = self.backward
        gradients = code.run(arrays)
        # (a gradient that is a cotangent as it came is copied)
        tensors = results(gradients, None if code.fresh_results else set(map(id, arrays)))
        return [None if g is None else tensors[g] for g in self.gradients]


def split_signature(recording: "Recording", function: "Graph", wrt: list[tuple[str, int] | None],
                    differentiable: list[int], optimize: Callable[["Graph"], "Graph"]
                    ) -> Split | None:
    """The split of a traced call (`function` its grad stage, `wrt` what each input's gradient is
    taken with respect to: gradient_positions); None where its
    backward cannot run on its own (it then runs the function again: runtime/differentiable.py),
    or reads a parameter the function writes (weights clipped in place then used) or a .grad,
    or a Function on the host differentiates it (its backward reads the ctx its forward's run
    left in Python until the next run: it must run in the call of that run), or the function
    registers gradient hooks (kept by the trace's values, which the split's copy has not) or
    changes in place a value its backward reads (Recording.replays_backward)."""
    if recording.replays_backward or any(isinstance(rule.backward, HostBackward)
                                         for rule in recording.rules):
        return None
    try:
        parts = split(function, differentiable, [p for p in wrt if p is not None], optimize,
                      len(recording.result_leaves))
    except Unsplittable:  # (also a custom backward that raised, or that the trace refuses)
        return None
    written = {index for index, _, _ in recording.writebacks}
    reads = [recording.sources[index] for kind, index in parts.sources if kind == "parameter"]
    if any(kind == "grad" or leaf in written for kind, leaf in reads):
        return None
    return parts


def reached_results(function: "Graph", wrt: list[tuple[str, int] | None],
                    differentiable: list[int]) -> list[frozenset[int]]:
    """Per input of a call's tape node (`wrt`: gradient_positions), the differentiated results
    (by position in `differentiable`) whose value `function` (the grad stage) computes from it:
    autograd.record_call leaves its gradient None where none of those is given one. (As
    PyTorch's graph, it runs through neither a detach nor a comparison.)"""
    producer = {id(v): i for i in function.instructions for v in i.outputs}
    depends_on = []
    for result in differentiable:
        seen: set[int] = set()
        pending = [function.outputs[result]]
        while pending:
            value = pending.pop()
            if id(value) not in seen:
                seen.add(id(value))
                instruction = producer.get(id(value))
                # (no gradient reaches a detached value or one that is not a float, a mask)
                if (instruction is not None and instruction.primitive != "stop_gradient"
                        and is_float(value.dtype)):
                    pending += instruction.inputs
        depends_on.append(seen)
    targets = [None if position is None else
               id((function.parameters if position[0] == "parameter" else function.outputs)[
                   position[1]]) for position in wrt]
    return [frozenset(k for k, seen in enumerate(depends_on) if target in seen)
            for target in targets]


def gradient_positions(recording: "Recording", values: list) -> list[tuple[str, int] | None]:
    """What the gradient of each input of a call's tape node (gradient_inputs of `values`, its
    argument leaves then its captured tensors) is taken with respect to: ("parameter", p) its data
    as the function reads it; ("output", i) as the function leaves it, where it changes it (a
    tensor that requires grad changed under no_grad: PyTorch differentiates its new data); None
    for one the function does not read."""
    first: dict[int, int] = {}
    for index, value in enumerate(values):
        first.setdefault(id(value), index)
    position = {source: p for p, source in enumerate(recording.sources)}
    rewritten = {index: output for index, kind, output in recording.writebacks if kind == "data"}
    result: list[tuple[str, int] | None] = []
    for tensor in gradient_inputs(values[:len(values) - len(recording.captured)],
                                  recording.captured):
        leaf = first[id(tensor)]
        if leaf in rewritten:
            result.append(("output", rewritten[leaf]))
        elif ("leaf", leaf) in position:
            result.append(("parameter", position[("leaf", leaf)]))
        else:
            result.append(None)
    return result
