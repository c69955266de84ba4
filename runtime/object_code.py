"""LLVM IR text to object code for the host CPU: parse, verify, optimize at O3 (new pass manager),
emit object code.

This module imports nothing but llvmlite and the standard library: the compile worker
(runtime/compile_worker.py) loads it on its own, without the tracer package, so that it starts
in a fifth of the time (0.2 s against 0.9 s on the loaded 2-core machine). runtime/native.py
links the object code it makes.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

import llvmlite.binding as llvm


@functools.cache
def initialize() -> None:
    try:
        llvm.initialize()
    except RuntimeError:  # llvmlite >= 0.45 initializes itself and refuses the call
        pass
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def llvm_host() -> tuple[str, str, str, str]:
    """(target triple, CPU name, CPU features, LLVM version) as LLVM sees this machine
    (runtime/native.py's Host; native.host remembers it, so that loading asks nothing of LLVM)."""
    initialize()
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten(), ".".join(map(str, llvm.llvm_version_info)))


def new_target_machine(level: int = 3) -> llvm.TargetMachine:
    """A fresh target machine generating code at optimization `level` (an execution engine takes
    ownership of the one it is given)."""
    triple, cpu, features, _ = llvm_host()
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=level,
                                        reloc="default", codemodel="jitdefault")


@functools.cache
def target_machine(optimized: bool = True) -> llvm.TargetMachine:
    """The target machine the optimizer, the code generator and the assembly printer share (never
    given away). An unoptimized module (a program's entry, a sequence of calls) gets LLVM's quick
    code generation (level 0: fast instruction selection and register allocation): the GPT step's
    entry, 400 calls, took 175 ms at level 3 against 45 ms."""
    return new_target_machine(3 if optimized else 0)


def optimize_module(module: llvm.ModuleRef, quick: bool = False) -> None:
    """LLVM's optimizer at O3, vectorizing; or, `quick`, at O1 without vectorizing."""
    tuning = llvm.create_pipeline_tuning_options(speed_level=1 if quick else 3)
    tuning.loop_vectorization = tuning.slp_vectorization = not quick
    builder = llvm.create_pass_builder(target_machine(), tuning)
    builder.getModulePassManager().run(module, builder)


def _optimized_module(text: str, optimized: bool, quick: bool) -> llvm.ModuleRef:
    initialize()
    module = llvm.parse_assembly(text)
    module.verify()
    if optimized:
        optimize_module(module, quick)
    return module


def optimized_ir(text: str, optimized: bool = True, strength_reduction: bool = True,
                 quick: bool = False) -> str:
    """The module `text` as `compile_object` compiles it, printed."""
    return str(_optimized_module(text, optimized, quick))


def assembly(text: str, optimized: bool = True, strength_reduction: bool = True,
             quick: bool = False) -> str:
    """The assembly `compile_object` makes of the module `text`."""
    module = _optimized_module(text, optimized, quick)
    with _code_generation(strength_reduction):
        return target_machine(optimized and not quick).emit_assembly(module)


def compile_object(text: str, optimized: bool = True, strength_reduction: bool = True,
                   quick: bool = False) -> bytes:
    """Parse, verify and (unless not `optimized`) optimize the module `text`, and emit its object
    code. The optimizer is what takes the time, and llvmlite keeps ~95 KB of memory for every run
    of it: a module of calls alone (a program's entry) is not worth it. Without
    `strength_reduction`, code generation leaves out LLVM's loop strength reduction (see
    `_code_generation`). `quick` (a kernel whose time does not matter) optimizes at O1 without
    vectorizing, and generates code as for an unoptimized module: half the CPU time of O3's or
    less (95 against 246 ms for the GPT step's 9 smallest kernels), for scalar code."""
    module = _optimized_module(text, optimized, quick)
    with _code_generation(strength_reduction):
        return target_machine(optimized and not quick).emit_object(module)


_code_generation_lock = threading.Lock()


@contextlib.contextmanager
def _code_generation(strength_reduction: bool) -> Iterator[None]:
    """Code generation with or without LLVM's loop strength reduction (LSR), an option of the
    whole process that is set back after. LSR rewrites a loop's affine addresses into pointer
    increments; on loops whose addresses come from integer division and remainder (a transpose, a
    split of heads) it has little to rewrite, yet it took 57% of all code generation of the GPT
    step (6.3 of 11.8 s CPU, `llvm.set_time_passes`), most of it on such loops."""
    with _code_generation_lock:
        if not strength_reduction:
            llvm.set_option("tracer", "-disable-lsr=true")
        try:
            yield
        finally:
            if not strength_reduction:
                llvm.set_option("tracer", "-disable-lsr=false")
