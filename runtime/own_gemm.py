"""The project's own float32 gemm (codegen/templates/sgemm.ll.j2), which compiled code reaches as
`tracer_sgemm` in place of OpenBLAS's on the CPUs where it measured faster.

Compiled code calls gemm by name (runtime/native.py registers `tracer_sgemm` to numpy's OpenBLAS).
On a host with AVX-512 this module compiles its gemm once per process (or loads it from the disk
cache) when code that calls `tracer_sgemm` is first linked, and registers the name to it instead.
Measured on an Intel Sapphire Rapids core (one thread, the GPT step's products, medians of 30
interleaved calls; `python -m benchmarks.own_gemm`): 165-173 GF/s against OpenBLAS 0.3.31's 137-151
(0.82-0.89 of its time) where A is read as stored, 154-157 against 137-143 (0.89-0.91) where it
is read transposed (G^T @ X, the weights' gradients); the core's FMA peak is 224 GF/s. A panel
at C's right edge runs the narrowest of three micro-kernels (16, 32 or 48 columns) that covers it:
so products of 64 or 100 columns run at 0.74-0.80 and 0.90-0.94 of OpenBLAS's time (1.1 with the
48-column tile padded: the seed step's 64x1000x100 and 1000x64x100, 2048x64x64; `python -m
benchmarks.own_gemm shapes --rounds 40`, 2026-11-28). On an
AVX2-only host (the same core compiled without AVX-512, against OpenBLAS's Haswell kernels) it was
no faster, so there, and where the CPU is AMD's (not measured), OpenBLAS stays. Its results differ
from OpenBLAS's in the last bits (another order of the sum), but every element is one sum in an
order that does not depend on which rows or columns a call covers: the blocks the thread pool
splits a product into give the bits of one call, whatever the number of threads.
TRACER_OWN_GEMM=0 keeps OpenBLAS (to compare the two).
"""
from __future__ import annotations

import os
import threading

from tracer.runtime import loader, native
from tracer.runtime.cache import ObjectCache, cache_key, open_entry

SYMBOL = "tracer_large_sgemm"  # the name compiled code calls for large products
FUNCTION = "tracer_own_sgemm"  # this module's function (not containing SYMBOL: see needed_by)
# <16 x float> vectors: a tile of 8 rows x 48 columns of C in 24 of the 32 registers (tiles of
# 12 x 32 and 6 x 64 ran 4-6% slower); sums over 384 steps of k between C's updates; B packed 384
# columns at a time (590 KB of a 2 MB L2: with 768, products of 768 columns and k = 2048 ran
# 10-15% slower, the others alike); a transposed A packed 48 rows at a time; the loop over k
# unrolled 4 times (once or twice was slower). Measured one variant against another in one
# process, interleaved (the template's parameters; benchmarks/own_gemm.py times this one).
AVX512 = {"width": 16, "mr": 8, "nr": 48, "kc": 384, "nc": 384, "ma": 48, "unroll": 4}

COMPILE_OPTIONS = {"optimized": True, "strength_reduction": True}  # (of its compile job)
_lock = threading.Lock()
_module: list[native.JitModule] = []  # the compiled gemm, once registered (kept to the end)


def parameters(cpu: str, features: str) -> dict[str, int] | None:
    """The template's parameters for this CPU (LLVM's name and features), or None where OpenBLAS
    stays (see the module docstring)."""
    if os.environ.get("TRACER_OWN_GEMM") == "0" or cpu.startswith("znver"):
        return None
    return AVX512 if "+avx512f" in features.split(",") else None


def needed_by(code: bytes) -> bool:
    """Whether object code calls the float32 gemm (its name is in the symbol table)."""
    return SYMBOL.encode() in code


def called_in(text: str) -> bool:
    """Whether LLVM text calls it (every module that may declares it)."""
    return f"call void @{SYMBOL}(" in text


def register(compiled: bytes | None = None) -> None:
    """Make `tracer_large_sgemm` resolve to this module's gemm in code linked from now on, if this
    host has one (once per process; OpenBLAS's registration stays otherwise). `compiled` is its
    object code if a program's compilation made it (see `compile_job`)."""
    with _lock:
        chosen = host_parameters()
        if _module or chosen is None:
            return
        host = native.host()
        if compiled is not None:
            cache = _cache(host, chosen)
            if cache is not None:
                cache.store(compiled)
            module = native.JitModule.link([compiled])
        else:
            module = load_or_compile(host, chosen)
        loader.add_symbol(SYMBOL, module.address(FUNCTION))
        _module.append(module)


def compile_job() -> str | None:
    """The gemm's LLVM text, for the compilation of a program that calls it to compile with its
    kernels (runtime/kernels.py, in the compile worker), if this process would use it, has none
    yet and the disk cache holds none: compiled when the program was linked, it took ~150 ms of
    the first such program's cold compile."""
    chosen = host_parameters()
    if _module or chosen is None:
        return None
    host = native.host()
    cache = _cache(host, chosen)
    if cache is not None and cache.load() is not None:
        return None
    return _text(host, chosen)


def host_parameters() -> dict[str, int] | None:
    """This host's parameters, None where OpenBLAS stays (or numpy has none: no product calls
    a gemm then)."""
    if not native.blas_available():  # (which registers OpenBLAS's gemm first)
        return None
    host = native.host()
    return parameters(host.cpu, host.features)


def _cache(host: native.Host, chosen: dict[str, int]) -> ObjectCache | None:
    settings = "own sgemm " + ", ".join(f"{key}={value}" for key, value in sorted(chosen.items()))
    return open_entry(cache_key(settings, host.triple, host.cpu, host.features, False,
                                host.llvm_version))


def _text(host: native.Host, chosen: dict[str, int]) -> str:
    from tracer.codegen.template_environment import render
    from tracer.runtime import template_cache
    template_cache.install()
    return render("sgemm.ll.j2", triple=host.triple, name=FUNCTION, **chosen)


def load_or_compile(host: native.Host, chosen: dict[str, int]) -> native.JitModule:
    """The gemm made with the template parameters `chosen`, linked: its object code from the
    disk cache, else compiled (and stored). Neither counts as a program's compile or disk hit
    (native.STATISTICS): it is the runtime's, like OpenBLAS. (LLVM compiles <16 x float> for any
    x86-64 CPU, in the vectors it has: the tests run this gemm on every host.)"""
    cache = _cache(host, chosen)
    cached = cache.load() if cache is not None else None
    if cached is not None:
        try:
            return native.JitModule.link([cached])
        except RuntimeError as error:
            native.LOG.warning("could not load the own gemm from %s (%s); compiling it again",
                               cache.path, error)
    from tracer.runtime.object_code import compile_object
    code = compile_object(_text(host, chosen))
    if cache is not None:
        cache.store(code)
    return native.JitModule.link([code])
