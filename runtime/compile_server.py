"""The compile worker's side of runtime/compile_worker.py, and the messages both sides exchange.

The worker is a plain `python` running this file (runpy, as a script: not multiprocessing, which
would run the user's `__main__` again in it). It reads jobs from stdin -- a module's LLVM IR text
and the options of `object_code.compile_object` -- and writes to stdout, for each in turn, its
object code (None if LLVM refused it: this process compiles it again and reports the error) and
the worker's CPU time so far, until stdin closes.

It imports the standard library, and llvmlite through runtime/object_code.py loaded from its
file: not the tracer package (numpy, the whole API), which took 0.5 of the 0.6 s of CPU a worker
needed to start (0.9 s against 0.2 s of wall-clock time on the loaded 2-core machine).
"""
from __future__ import annotations

import importlib.util
import os
import pickle
import struct
import sys
import time
from typing import BinaryIO

_LENGTH = struct.Struct("<Q")


def write(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def read(stream: BinaryIO) -> object:
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the compile worker closed its pipe")
    (length,) = _LENGTH.unpack(header)
    return pickle.loads(stream.read(length))


def _load_beside(name: str):
    """The module `name`.py of this file's folder, loaded on its own (not as part of a package)."""
    spec = importlib.util.spec_from_file_location(
        f"tracer_worker_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def serve() -> None:
    """The worker's loop: a job from stdin, its object code and the CPU time to stdout."""
    object_code = _load_beside("object_code")
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what LLVM or Python might print goes to stderr, never into the pipe
    while True:
        try:
            text, options = read(requests)
        except EOFError:
            return
        try:
            compiled = object_code.compile_object(text, **options)
        except Exception:  # noqa: BLE001 - the parent compiles it again and reports the error
            compiled = None
        write(replies, (compiled, time.process_time()))


if __name__ == "__main__":
    serve()
