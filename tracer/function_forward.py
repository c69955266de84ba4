"""What a custom Function's forward does to its inputs and returns, as PyTorch takes it.

A forward runs without recording gradients, so it may change its inputs in place and mark them
with `ctx.mark_dirty`. PyTorch then refuses a dirty input that is a leaf requiring grad (the
values a gradient is for would be gone); here the refusal also puts the user's tensors back as they
were before the forward, which PyTorch does not. And a tensor returned at several places is one
result, as in PyTorch.
"""
from __future__ import annotations

import contextlib

import numpy as np

from tracer.context import is_grad_enabled, state
from tracer.errors import InplaceError
from tracer.tensor import Tensor


class ForwardChanges:
    """The old values of the inputs a Function's forward changes in place, each kept at its first
    change: a refused forward puts them back. Forwards nest (a Function applied in another's
    forward): a change is seen by every forward running."""

    def __init__(self, inputs: list[Tensor]):
        self.inputs = inputs
        self.previous: ForwardChanges | None = None
        # id(input) -> (input, old values, version, where last changed, the weak references to
        # the tape nodes that read it and did not yet refuse to run backward)
        self.kept: dict[int, tuple] = {}

    def before_change(self, tensor: Tensor) -> None:
        if id(tensor) in self.kept or not any(tensor is t for t in self.inputs):
            return
        unaware = [reference for reference in tensor._saved_by
                   if reference() is not None and reference().changed is None]
        self.kept[id(tensor)] = (tensor, tensor._handle.copy(), tensor._version,
                                 tensor._changed_at, unaware)

    def restore(self) -> None:
        """Put every changed input back: its values, its version, and the tape nodes that its
        change made refuse to run backward."""
        for tensor, values, version, changed_at, unaware in self.kept.values():
            np.copyto(tensor._handle, values)
            tensor._version, tensor._changed_at = version, changed_at
            for reference in unaware:
                node = reference()
                if node is not None:
                    node.changed = None

    @contextlib.contextmanager
    def watching(self):
        """While the forward runs, in-place changes of its inputs are seen here."""
        self.previous, state.forward_changes = state.forward_changes, self
        try:
            yield
        finally:
            state.forward_changes = self.previous


def before_inplace_change(tensor: Tensor) -> None:
    """Called by every in-place change just before it writes `tensor`'s buffer."""
    changes = state.forward_changes
    while changes is not None:
        changes.before_change(tensor)
        changes = changes.previous


@contextlib.contextmanager
def inputs_kept(inputs: list[Tensor]):
    """Around a Function's forward and the checks of what it returned: an error in either leaves
    the inputs as they were. Yields the context manager to run the forward in. Values are kept
    only eagerly (traced, nothing ran yet) and only while an input is a leaf that requires grad
    with gradients recorded, the one case `refuse_dirty_leaves` refuses."""
    if state.trace is not None or not is_grad_enabled() or not any(
            t.is_leaf and t.requires_grad for t in inputs):
        yield contextlib.nullcontext
        return
    changes = ForwardChanges(inputs)
    try:
        yield changes.watching
    except BaseException:
        changes.restore()
        raise


def refuse_dirty_leaves(name: str, dirty: list[Tensor]) -> None:
    """As PyTorch: a forward may not change in place (and mark dirty) a leaf that requires grad
    while gradients are recorded."""
    for tensor in dirty:
        if is_grad_enabled() and tensor.is_leaf and tensor.requires_grad:
            raise InplaceError(
                f"{name}.forward changed in place (ctx.mark_dirty) a leaf tensor of shape "
                f"{list(tensor.shape)} that requires grad; PyTorch refuses this (the values its "
                f"gradient is for would be gone). Pass a clone (x.clone()), or apply the Function "
                f"under tr.no_grad()")


def last_places(outputs: list, inputs: list[Tensor], dirty: list[Tensor]) -> dict[int, int]:
    """By id, the last place among `outputs` of each tensor that is not an unchanged input: a
    tensor returned at several places is one result, the output at its last place (PyTorch's
    output_nr), and the earlier places get no gradient. An input returned as it is becomes a new
    tensor at each place, as PyTorch's views of it do."""
    places = {}
    for place, output in enumerate(outputs):
        if isinstance(output, Tensor) and (not any(output is t for t in inputs)
                                           or any(output is d for d in dirty)):
            places[id(output)] = place
    return places
