"""Containers of modules, as in PyTorch: `Sequential` (applies its modules in order),
`ModuleList` and `ModuleDict` (hold modules so that their parameters are registered, for a
`forward` that uses them itself)."""
from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Iterable, Iterator, Mapping

from tracer.errors import ArgumentError
from tracer.nn.modules import Module


def _checked(module, container: str) -> Module:
    if not isinstance(module, Module):
        raise ArgumentError(f"{container} holds tr.nn.Module objects, got {type(module).__name__}")
    return module


class _Indexed(Module):
    """Modules registered under the names "0", "1", ...: what Sequential and ModuleList share."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def _position(self, index) -> int:
        """`index` as a position from the start, counting a negative one from the end."""
        position, count = operator.index(index), len(self._modules)
        if not -count <= position < count:
            raise IndexError(f"index {position} is out of range for {type(self).__name__} of "
                             f"{count} modules")
        return position % count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(list(self._modules.values())[index])
        return list(self._modules.values())[self._position(index)]

    def __setitem__(self, index: int, module: Module) -> None:
        self._modules[str(self._position(index))] = _checked(module, type(self).__name__)

    def __delitem__(self, index) -> None:
        modules = list(self._modules.values())
        del modules[index if isinstance(index, slice) else self._position(index)]
        self._modules.clear()  # the names stay "0", "1", ... in order, as in PyTorch
        self.extend(modules)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._modules.values()))

    def append(self, module: Module):
        self.add_module(str(len(self._modules)), _checked(module, type(self).__name__))
        return self

    def extend(self, modules: Iterable[Module]):
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, _checked(module, type(self).__name__))
        self._modules.clear()
        self.extend(modules)

    def __iadd__(self, modules: Iterable[Module]):
        return self.extend(modules)

    def pop(self, index: int) -> Module:
        module = self[index]
        del self[index]
        return module


class Sequential(_Indexed):
    """Modules applied in order; `Sequential(a, b)` or `Sequential(OrderedDict(name=module))`."""

    def __init__(self, *modules) -> None:
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            super().__init__()
            for name, module in modules[0].items():
                self.add_module(name, _checked(module, "Sequential"))
        else:
            super().__init__(modules)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*list(self._modules.values())[index])
        return super().__getitem__(index)

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input


class ModuleList(_Indexed):
    """A list of modules whose parameters belong to the list's owner; index, iterate, append."""

    def __add__(self, other: Iterable[Module]) -> "ModuleList":
        return ModuleList([*self, *other])


class ModuleDict(Module):
    """A dict of modules by name whose parameters belong to the dict's owner."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None
                 ) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, _checked(module, "ModuleDict"))

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        for key, module in (modules.items() if isinstance(modules, Mapping) else modules):
            self[key] = module
