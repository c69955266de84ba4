"""The builder of a backward that records its own graph (`create_graph=True`): the VJP rules of
ir/vjp.py, written once against `ir.Builder`, applied to eager Tensors, so that every operation of
the backward goes onto the tape and can be differentiated again."""
from __future__ import annotations

from tracer.ir.builder import Builder
from tracer.ir.types import TensorType
from tracer.autograd import LeafAccumulator, Node
from tracer.dispatch import apply
from tracer.tensor import Tensor


def _stand_in(array, edge, original: Tensor | None) -> Tensor:
    """A tensor holding `array` (a value a node read) whose gradient goes along `edge`: to the
    node output that computed it, to a leaf's accumulator, or nowhere (a constant). It shares the
    buffer of the `original` tensor, if that is still alive: it stands for it as a view-copy does
    for its base, so that the nodes that read it refuse, at the second backward, an in-place
    change of the original (as PyTorch's double backward does)."""
    if edge is None:
        tensor = Tensor._make(array, None, False)
    elif isinstance(edge, LeafAccumulator):
        tensor = Tensor._make(array, None, True, leaf=True)
        tensor._accumulator = edge  # (edge_of gives it back: the gradient reaches the leaf)
    else:
        node, index = edge
        tensor = Tensor._make(array, None, True, node, index, leaf=False)
    if original is not None:
        tensor._view_of = "a value saved for the backward"
        tensor._view_base, tensor._view_version = original, original._version
        tensor._view_shares_version = True
    return tensor


class TensorBuilder(Builder):
    """Handles are eager Tensors; every operation goes through `dispatch.apply`, so it runs at once
    and records onto the tape (grad mode is on during a create_graph backward)."""

    def type_of(self, handle: Tensor) -> TensorType:
        return TensorType(handle.shape, handle.dtype)

    def emit(self, primitive, inputs, attributes):
        return [apply(primitive, inputs, **attributes)]

    @staticmethod
    def operands_of(node: Node) -> tuple[list[Tensor], list[Tensor]]:
        """The values `node` read and computed, as tensors connected to the graph: its inputs to
        whatever produced them, its outputs to the node itself (exp's gradient reads exp(x),
        whose own gradient goes through exp again)."""
        saved = (reference() for reference in node.saved)
        originals = {id(t._handle): t for t in saved if t is not None and t._trace is None}
        inputs = [_stand_in(array, edge, originals.get(id(array)))
                  for array, edge in zip(node.inputs, node.edges)]
        outputs = [_stand_in(array, (node, index), originals.get(id(array)))
                   for index, array in enumerate(node.outputs)]
        return inputs, outputs


TENSORS = TensorBuilder()
