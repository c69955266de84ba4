"""Warm entries of the disk cache: a signature's object code found by its `grad` stage, so that a
fresh process whose program a previous one compiled traces it and runs it, without optimizing,
fusing or planning memory (runtime/pipeline.py's `compile_warm`).

A warm entry is keyed as an object entry is (runtime/cache.py's `cache_key`: the compiler, the
host, the settings) but from the program text of the `grad` stage -- the graph after the autodiff
pass, without the user's lines, with the in-place pairs and the code settings -- and holds the key
of the object entry that the optimized program compiled to and the calling convention of that
code (runtime/convention.py). The optimized graph is a function of the grad stage (the passes are
deterministic), so the entry names the code that compiling would have made; the optimized graph,
its fused kernels, memory plan, loop IR and LLVM text are made again only if something asks for
them (`f.ir`, the report, a failed check's message), and that they give the same object key is
checked then. A warm entry whose object entry was evicted is a miss (compiled and stored again).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from tracer.runtime import native
from tracer.runtime.cache import WARM_SUFFIX, open_entry, unpack_objects
from tracer.runtime.code_settings import CodeSettings
from tracer.runtime.compiled import CompiledFunction
from tracer.runtime.convention import CallingConvention

if TYPE_CHECKING:
    from tracer.ir.graph import Graph

_KEY_BYTES = 32  # a disk key (SHA-256)


def load(warm_key: bytes) -> tuple[CallingConvention, bytes, list[bytes], str] | None:
    """The calling convention, object key and object code of the warm entry `warm_key`, and its
    path; None where the entry or its object entry is absent or invalid."""
    entry = open_entry(warm_key, WARM_SUFFIX)
    payload = entry.load() if entry is not None else None
    if payload is None or len(payload) <= _KEY_BYTES:
        return None
    disk_key = payload[:_KEY_BYTES]
    objects_entry = open_entry(disk_key)
    packed = objects_entry.load() if objects_entry is not None else None
    objects = unpack_objects(packed) if packed is not None else None
    if objects is None:
        return None
    return CallingConvention.from_bytes(payload[_KEY_BYTES:]), disk_key, objects, str(entry.path)


def store(warm_key: bytes, disk_key: bytes, convention: CallingConvention) -> None:
    """Write the warm entry `warm_key`: code of object key `disk_key`, called by `convention`."""
    entry = open_entry(warm_key, WARM_SUFFIX)
    if entry is not None:
        entry.store(disk_key + convention.to_bytes())


class LazyBackEnd:
    """The back end of a warm hit, as runtime/compiled.py reads it: the convention, settings,
    object key and stage names at once; the optimized graph (`function`) made by `optimized()`
    and everything else of the BackEnd (fused kernels, plan, loops, LLVM text, stage texts) by
    `build()` when first asked for, its steps timed in `timings` after the hit's `load`."""

    def __init__(self, convention: CallingConvention, settings: CodeSettings, disk_key: bytes,
                 stages: tuple[str, ...], optimized: Callable[[], Graph],
                 build: Callable[[], Any]):
        self.convention, self.settings, self.disk_key, self.stages = (convention, settings,
                                                                      disk_key, stages)
        self.error_record, self.arena_size = convention.error_record, convention.arena_size
        self.timings: dict[str, float] = {}
        self.compile_steps: tuple[str, ...] = ()
        self._optimized, self._build = optimized, build

    @property
    def function(self) -> Graph:
        return self._optimized()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        built = self.__dict__.get("_built")
        if built is None:
            built = self._built = self._build()
        return getattr(built, name)

    def load(self, objects: list[bytes], path: str) -> CompiledFunction | None:
        """The CompiledFunction of `objects` (from the entry at `path`); None if LLVM refuses them
        (as BackEnd.load)."""
        started = time.perf_counter()
        try:
            compiled = CompiledFunction(self, objects, from_disk_cache=True)
        except RuntimeError as error:
            native.LOG.warning("%s: could not load the warm disk cache entry (%s); compiling it "
                               "again", self.convention.name, error)
            return None
        native.count("disk_hits")
        native.LOG.debug("disk cache hit: %s (warm: found by the grad stage)", path)
        self.timings["load"] = time.perf_counter() - started
        self.compile_steps = ("load",)
        return compiled
