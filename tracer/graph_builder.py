"""The builder of a backward that records its own graph (`create_graph=True`): the VJP rules of
ir/vjp.py, written once against `ir.Builder`, applied to eager Tensors, so that every operation of
the backward goes onto the tape and can be differentiated again."""
from __future__ import annotations

from tracer.ir.builder import Builder
from tracer.ir.types import TensorType
from tracer.autograd import LeafAccumulator, Node
from tracer.dispatch import apply
from tracer.tensor import Tensor


def _stand_in(array, edge) -> Tensor:
    """A tensor holding `array` (a value a node read) whose gradient goes along `edge`: to the
    node output that computed it, to a leaf's accumulator, or nowhere (a constant)."""
    if edge is None:
        return Tensor._make(array, None, False)
    if isinstance(edge, LeafAccumulator):
        tensor = Tensor._make(array, None, True, leaf=True)
        tensor._accumulator = edge  # (edge_of gives it back: the gradient reaches the leaf)
        return tensor
    node, index = edge
    return Tensor._make(array, None, True, node, index, leaf=False)


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
        inputs = [_stand_in(array, edge) for array, edge in zip(node.inputs, node.edges)]
        outputs = [Tensor._make(array, None, True, node, index, leaf=False)
                   for index, array in enumerate(node.outputs)]
        return inputs, outputs


TENSORS = TensorBuilder()
