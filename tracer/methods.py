"""The Tensor API assembled: each group of methods, defined in the module of its job, given to the
class (see tracer/tensor.py), and the indexing methods, which tie the index operations of
tracer/indexing.py and tracer/gathering.py to the in-place machinery."""
from __future__ import annotations

from tracer.arithmetic import ArithmeticMethods
from tracer.backward import BackwardMethods
from tracer.creation import CreationMethods
from tracer.device import DeviceMethods
from tracer.hooks import HookMethods
from tracer.dimensions import number_indices
from tracer.dispatch import DispatchMethods
from tracer.gathering import (gather, index_add, index_select, scatter, scatter_add,
                              take_along_dim)
from tracer.indexing import getitem, setitem
from tracer.inplace import InPlaceMethods
from tracer.layout import LayoutMethods
from tracer.random import RandomMethods
from tracer.reductions import ReductionMethods
from tracer.rounding import RoundingMethods
from tracer.serialization import PickleMethods
from tracer.sorting import SortingMethods
from tracer.tensor import Tensor, add_methods


class IndexMethods:
    """Tensor's indexing, index assignment and index operations."""

    def __getitem__(self, key) -> Tensor:
        return getitem(self, number_indices(key))

    def __setitem__(self, key, value) -> None:
        self._assign(setitem(self, number_indices(key), value), "index assignment")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        return index_select(self, dim, index)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        return gather(self, dim, index)

    def take_along_dim(self, indices: Tensor, dim: int | None = None) -> Tensor:
        return take_along_dim(self, indices, dim)

    def index_add(self, dim: int, index: Tensor, source, alpha=1) -> Tensor:
        return index_add(self, dim, index, source, alpha)

    def index_add_(self, dim: int, index: Tensor, source, alpha=1) -> Tensor:
        return self._assign(self.index_add(dim, index, source, alpha), "index_add_")

    def scatter(self, dim: int, index: Tensor, src=None, *, value=None, reduce=None) -> Tensor:
        return scatter(self, dim, index, src, value=value, reduce=reduce)

    def scatter_(self, dim: int, index: Tensor, src=None, *, value=None, reduce=None) -> Tensor:
        return self._assign(scatter(self, dim, index, src, value=value, reduce=reduce),
                            "scatter_")

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        return scatter_add(self, dim, index, src)

    def scatter_add_(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        return self._assign(scatter_add(self, dim, index, src), "scatter_add_")


for _group in (DispatchMethods, DeviceMethods, LayoutMethods, ArithmeticMethods, ReductionMethods,
               InPlaceMethods, IndexMethods, BackwardMethods, HookMethods, RoundingMethods,
               PickleMethods, RandomMethods, SortingMethods, CreationMethods):
    add_methods(_group)
