"""Random numbers that Python code draws while it is traced, from Python's or numpy's generators
(`random.random()`, `np.random.rand`, a `np.random.default_rng` Generator the function reaches):
drawn once, while tracing, they would be compiled in, the same on every call, where eager mode
draws new ones each call (a mask for a hand-written dropout, noise for augmentation). The trace
compares each generator's state before and after and refuses the draw, with the generator put back
as it was. tracer's own random functions raise as well (tr.randn) or draw at run time (dropout's
counter-based Generator, tracer/random.py)."""
from __future__ import annotations

import builtins
import contextlib
import functools
import random
import threading
from types import CodeType
from typing import Any, Iterable, Iterator

import numpy as np

from tracer.errors import project_file

# What a walk of the traced function's globals, closure and objects keeps as a generator.
GENERATORS = (random.Random, np.random.RandomState, np.random.Generator)


@functools.cache
def methods() -> frozenset[str]:
    """The methods and functions that draw or reseed (np.random.rand, random.randint, rng.normal,
    seed, ...): not those that read the state, nor names of builtins (`bytes`) or as common as
    `f` (the F distribution's) and `test` (numpy's test runner). Listed when first needed, which
    is rarely (listing them took ~1 ms of every fresh process's tr.trace)."""
    return frozenset(
        name for kind in (*GENERATORS, np.random, random) for name in dir(kind)
        if name[0].islower() and len(name) > 1 and callable(getattr(kind, name))
        and not hasattr(builtins, name)
        and name not in {"getstate", "get_state", "get_bit_generator", "default_rng", "test"})


def _global_generators() -> list[tuple[str, Any]]:
    # (the random module's functions, and numpy.random's, are methods of one hidden instance)
    return [("the random module's generator (random.random, random.randint, ...)",
             random.random.__self__),
            ("numpy.random's global generator (np.random.rand, np.random.normal, ...)",
             np.random.random.__self__)]


def _state(generator) -> Any:
    if isinstance(generator, random.Random):
        return generator.getstate()
    if isinstance(generator, np.random.RandomState):
        return generator.get_state(legacy=False)
    return generator.bit_generator.state


def _set_state(generator, saved) -> None:
    if isinstance(generator, random.Random):
        generator.setstate(saved)
    elif isinstance(generator, np.random.RandomState):
        generator.set_state(saved)
    else:
        generator.bit_generator.state = saved


def _same(first, second) -> bool:
    """Equal states: tuples of ints, or dicts holding numpy arrays (a bit generator's key)."""
    if isinstance(first, dict):
        return (isinstance(second, dict) and first.keys() == second.keys()
                and all(_same(first[key], second[key]) for key in first))
    if isinstance(first, np.ndarray):
        return isinstance(second, np.ndarray) and np.array_equal(first, second)
    return first == second


class Draws:
    """The states of the global generators and of `reached` ((name, generator) pairs) when made;
    `drawn()` names the first one that has changed since and puts every one back."""

    def __init__(self, reached: Iterable[tuple[str, Any]]):
        self.generators = [*_global_generators(), *reached]
        self.states = [_state(generator) for _, generator in self.generators]
        # (a thread alive now may draw and end before `drawn`; one started later was started by
        # the traced function, whose draws its draws are)
        self.threads = threading.active_count()

    @contextlib.contextmanager
    def undone(self) -> Iterator[None]:
        """Inside, code may draw: the generators are put back as they were after it."""
        states = [_state(generator) for _, generator in self.generators]
        try:
            yield
        finally:
            for (_, generator), saved in zip(self.generators, states):
                _set_state(generator, saved)

    def drawn(self, codes: Iterable[CodeType] | None) -> str | None:
        """The first generator drawn from (or reseeded) since, all of them put back; None if
        none was, or if another thread was alive and no code of `codes` (the code that ran while
        tracing, if known) names a generator's method: that thread drew meanwhile (a data
        loader's augmentation), which stays drawn. With no other thread, the names are not
        asked: a draw through an alias (`draw = np.random.rand`) or `rng.bytes` names none."""
        changed = [(generator, saved) for (_, generator), saved in zip(self.generators, self.states)
                   if not _same(_state(generator), saved)]
        others = max(self.threads, threading.active_count()) > 1
        if not changed or (codes is not None and others and all(
                methods().isdisjoint(code.co_names) or project_file(code.co_filename)
                for code in codes)):
            return None
        for generator, saved in changed:
            _set_state(generator, saved)
        return next(name for name, generator in self.generators if generator is changed[0][0])
