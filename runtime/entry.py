"""A compiled signature: what a call of it needs (`Entry`), built from its recording and its
compiled code with the guards that say when it still applies (`build_entry`)."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

from tracer.ir.graph import Graph
from tracer.ir.text import format_function

from tracer.runtime.arguments import zeros_for
from tracer.runtime.floats import compile_reader
from tracer.runtime.guards import captured_names, captured_state, compile_check, guards_for
from tracer.runtime.recording import Recording
from tracer.buffers import grad_of
from tracer.tensor import Tensor, mark_view


class StageTexts(Mapping[str, str]):
    """The printed front-end stages of a signature, by name, each printed when first read from
    the graph the stage made: nobody reads them unless asked (`f.ir`, TRACER_DUMP, the report,
    the tests): printing and verifying the traced and grad stages took 45-270 ms of CPU of the GPT
    step's compile (the more, the busier the machine) against 6 ms to copy the traced graph, which
    the autodiff pass rewrites. (The graph compiled, the optimized one, is verified.)"""

    def __init__(self, graphs: dict[str, Graph | Callable[[], Graph]]):
        self._graphs = graphs  # (a graph, or what makes it: a warm hit's optimized one)
        self._texts: dict[str, str] = {}

    def __getitem__(self, stage: str) -> str:
        if stage not in self._texts:
            graph = self._graphs[stage]
            self._texts[stage] = format_function(graph if isinstance(graph, Graph) else graph())
        return self._texts[stage]

    def __iter__(self) -> Iterator[str]:
        return iter(self._graphs)

    def __len__(self) -> int:
        return len(self._graphs)


class Entry:
    """What a call of one compiled signature needs. (A plain class: @dataclass generating its
    methods took ~2.5 ms of a fresh process's tr.trace, which imports this module.)"""

    def __init__(self, structure: tuple, executable: Any, result_count: int,
                 writebacks: list[tuple[int, str, int]], cleared_grads: list[int],
                 parameter_sources: list[tuple[str, int]], captured: list[Tensor],
                 captured_state: list[tuple], stages: Mapping[str, str] | None = None,
                 rules: list | None = None):
        self.structure = structure  # of the results
        self.executable = executable
        self.result_count = result_count
        # (argument leaf index, "data" | "grad", output index) for every value written back.
        self.writebacks = writebacks
        self.cleared_grads = cleared_grads  # argument leaves whose .grad the function set to None
        # Where each parameter comes from: ("leaf" | "number" | "grad", leaf index).
        self.parameter_sources = parameter_sources
        self.captured = captured  # tensors read from outside: leaves after the arguments' leaves
        # their shape, dtype, requires_grad and .grad when traced
        self.captured_state = captured_state
        # Argument leaves and captured tensors whose .grad on entry the trace did not read: whether
        # they have one is no part of the signature (see Trace.writebacks).
        self.unread: frozenset[int] = frozenset()
        self.unread_captured: list[bool] = []
        # Floats read from outside (runtime/floats.py): the values after the captured tensors, read
        # by `read_floats()` on every call.
        self.floats: list = []
        self.read_floats: Callable[[], list] | None = None
        # printed when read (StageTexts)
        self.stages: Mapping[str, str] = stages if stages is not None else {}
        self.leaf_names: dict[int, str] = {}  # leaf index -> its path
        # Paths to what the function reads from its globals, closure and objects, with the value
        # when traced: a tensor, array or number there that changes means tracing again (see
        # runtime/guards.py).
        self.guards: list[tuple] = []
        # True while the guards hold and the captured tensors are as traced (runs on every call);
        # None when there is nothing to check (no guards, captured tensors or floats)
        self.check: Callable[[], bool] | None = None
        self.captured_names: list[str] = []  # what messages call them
        # custom rules the stage texts name, kept alive
        self.rules: list = rules if rules is not None else []
        # Results through which eager autograd can differentiate the call (those that require
        # grad, but Recording.stale ones), the leaves whose data the call overwrites and their
        # backward reads as it was on entry (Recording.replayed), and the traced forward+backward
        # that does it, made on demand.
        self.differentiable: list[int] = []
        # per input of the call's tape node, the `differentiable` results (positions) computed
        # from it (split_code.reached_results)
        self.reached: list[frozenset[int]] = []
        self.replayed: list[int] = []
        self.backward: Any = None  # (a TracedFunction)
        # Where the results are differentiated: the forward that `executable` is also returns
        # what the backward reads, and this (runtime/split_code.SplitCode) runs that backward;
        # None where the backward runs the function again (`backward`).
        self.split: Any = None
        # How the results relate to the tensors the caller holds (see `relate_results`):
        # (result position, leaf index, "data" | "grad" | "detach") of those returned as an
        # argument's or captured tensor's own tensor, its .grad or its detach(); (result
        # position, leaf index, "data" | "grad", view operation, shares version) of those marked
        # as view-copies of one; (result position, earlier position) of a tensor returned again;
        # the positions of the first and the last, for which no new tensor is made; and whether
        # there is any of them
        self.aliases: list[tuple[int, int, str]] = []
        self.views: list[tuple[int, int, str, str, bool]] = []
        self.repeats: list[tuple[int, int]] = []
        self.returned_as_is: frozenset[int] = frozenset()
        self.related = False
        # whether every output the compiled code returns twice is an array no tensor keeps but
        # one (a result returned as it is, an alias and its write-back), so that one array serves
        # all (else each is a copy)
        self.shares_outputs = False
        # Whether the parameters are the data of the argument leaves and captured tensors, in
        # order, every one a Tensor (buffers.tensor_buffers gives them; else
        # arguments.parameter_arrays)
        self.tensors_in_order = False
        # Read-only zeros passed for a .grad that is None, by parameter position
        # (arguments.zeros_for)
        self.zeros: dict = {}
        self.timings: dict[str, float] = {}  # seconds per front-end stage
        self.reason = ""  # why this signature compiled (see runtime/signatures.py)


def relate_results(entry: Entry, tensors: list, values: list) -> None:
    """Give the call's results (`tensors`, None where `entry.returned_as_is`) the relations to the
    caller's tensors (`values`: the argument leaves, then the captured tensors) that eager mode's
    results would have (Entry.aliases, views, repeats), after the call wrote back its changes."""
    for position, index, kind in entry.aliases:
        tensor = values[index]
        tensors[position] = (tensor if kind == "data" else grad_of(tensor) if kind == "grad"
                             else tensor.detach())
    for position, index, kind, what, shares in entry.views:
        mark_view(tensors[position], values[index] if kind == "data" else grad_of(values[index]),
                  what, shares)
    for position, earlier in entry.repeats:
        tensors[position] = tensors[earlier]


def differentiable_results(recording: Recording) -> list[int]:
    """The results through which eager autograd differentiates a call (Entry.differentiable): those
    that require grad, but Recording.stale ones, those that are an argument itself (which keep
    that tensor's own history) and those returned again (one tensor)."""
    returned_as_is = {position for position, _, _ in recording.aliases} | {
        position for position, _ in recording.repeats}
    return [i for i, value in enumerate(recording.result_leaves)
            if isinstance(value, Tensor) and value.requires_grad
            and i not in recording.stale and i not in returned_as_is]


def build_entry(recording: Recording, executable: Any, leaves: Sequence,
                stages: Mapping[str, str], timings: dict[str, float]) -> Entry:
    """The entry of a signature whose trace is `recording` (made from the argument `leaves`) and
    whose compiled code is `executable`, with its guards; `stages` and `timings` are the front
    end's (runtime/pipeline.py)."""
    captured = recording.captured
    entry = Entry(recording.result_structure, executable, len(recording.result_leaves),
                  recording.writebacks, recording.cleared, recording.sources, captured,
                  captured_state(captured), stages=stages, rules=recording.rules)
    entry.differentiable = differentiable_results(recording)
    entry.replayed = sorted(recording.replayed) if entry.differentiable else []
    entry.unread = frozenset(recording.unread)
    entry.unread_captured = [len(leaves) + k in entry.unread for k in range(len(captured))]
    entry.floats, entry.read_floats = recording.floats, compile_reader(recording.floats)
    entry.guards = guards_for(recording.reached, captured, recording.used,
                              [i.name for i in recording.floats])
    entry.check = compile_check(entry.guards, captured, entry.unread_captured, recording.floats)
    entry.captured_names = captured_names(recording.reached, captured)
    entry.leaf_names = {index: path for index, (_, path) in enumerate(leaves)}
    entry.leaf_names.update({len(leaves) + k: name
                             for k, name in enumerate(entry.captured_names)})
    # (a result aliasing a numpy array argument, or a view of one, is a tensor of its own)
    values = [*(value for value, _ in leaves), *captured]
    entry.aliases = [alias for alias in recording.aliases if isinstance(values[alias[1]], Tensor)]
    entry.views = [view for view in recording.views if isinstance(values[view[1]], Tensor)]
    entry.repeats = recording.repeats
    entry.returned_as_is = frozenset([position for position, _, _ in entry.aliases] +
                                     [position for position, _ in entry.repeats])
    entry.related = bool(entry.aliases or entry.views or entry.repeats)
    alias_of = {position: (index, kind) for position, index, kind in entry.aliases}
    written = {output: (index, "data" if kind == "data" else "grad")
               for index, kind, output in recording.writebacks}
    duplicates = executable.duplicates
    entry.shares_outputs = bool(duplicates) and all(
        (earlier in alias_of and written.get(position) == alias_of[earlier])
        or position in entry.returned_as_is for position, earlier in duplicates)
    entry.tensors_in_order = (not entry.floats and all(isinstance(v, Tensor) for v in values)
                              and recording.sources == [("leaf", i) for i in range(len(values))])
    entry.zeros = zeros_for(recording.sources, executable.convention.parameters,
                            set(executable.in_place.values()))
    entry.timings = timings
    return entry
