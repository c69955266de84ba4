"""`Named`: the sequences a custom Function's ctx gives its backward, readable by position
(PyTorch) and by name (R torch)."""
from __future__ import annotations


class Named:
    """A sequence whose entries can also be read by name: `ctx.needs_input_grad.weight`,
    `ctx.saved_variables.input` (R torch), as well as `ctx.needs_input_grad[1]` and
    `a, b = ctx.saved_tensors` (PyTorch). Not a tuple, so that arguments named like tuple
    methods (`count`, `index`) read their entries."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: list[str | None], values):
        self._names = list(names)
        self._values = tuple(values)

    def __getattr__(self, name: str):
        names = object.__getattribute__(self, "_names")
        if name in names:
            return self._values[names.index(name)]
        raise AttributeError(f"no entry named {name!r}; the names are {[n for n in names if n]}")

    def __getitem__(self, index):
        return self._values[index]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self):
        return iter(self._values)

    def __eq__(self, other) -> bool:
        return tuple(self._values) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._values)
