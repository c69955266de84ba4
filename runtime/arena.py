"""The arena a compiled function's temporaries live in (ir/memory.py plans it): numpy bytes,
aligned. A large one is made ahead, while its program compiles, in a thread that touches each of
its pages (numpy releases the interpreter's lock for the loop): the kernel backs a page with memory
only when it is first touched, and numpy asks for huge pages, which this machine's kernel
compacts memory for, so the first call of the GPT step ran 0.6-0.8 s longer than the next ones
(208 MB: 750 ms to touch in one thread; 4 KB pages took 195 ms, and made every call 6% slower).
"""
from __future__ import annotations

import threading

import numpy as np

from tracer.ir.types import ALIGNMENT

PAGE = 4096
# From this size on an arena is made ahead: a thread costs ~0.1 ms, and 16 MB of pages 10-60 ms.
AHEAD_BYTES = 16 * 2**20


def new_arena(size: int) -> tuple[np.ndarray, int]:
    """An arena of `size` bytes: the array that holds it and its aligned address."""
    storage = np.empty(size + ALIGNMENT, np.uint8)
    address = storage.ctypes.data
    return storage, address + (-address % ALIGNMENT)


class ArenaAhead:
    """An arena of `size` bytes, made and touched in a thread of its own from now on."""

    def __init__(self, size: int):
        self.size = size
        self.arena: tuple[np.ndarray, int] | None = None
        self.thread = threading.Thread(target=self._touch, daemon=True)
        self.thread.start()

    def _touch(self) -> None:
        storage, address = new_arena(self.size)
        storage[::PAGE] = 0
        self.arena = storage, address

    def take(self) -> tuple[np.ndarray, int]:
        """The arena, once its thread has touched it (made here if the thread could not)."""
        self.thread.join()
        return self.arena if self.arena is not None else new_arena(self.size)
