"""Compiling many LLVM modules at once on two processors: a worker process compiles modules from
the end of the list while this process compiles from the front, until they meet.

llvmlite holds a lock of its own around LLVM, so threads would take turns; a second process does
not. The worker is a plain `python` reading modules from a pipe (not multiprocessing, which would
run the user's `__main__` again in it): started at the first big compile (`start`), it imports
while this process fuses and renders, and it stays, idle, for the process's later compiles; it
exits when this process closes the pipe. If it cannot start or dies, this process compiles what
it left. Its object code is what `jit.compile_object` makes here (the same LLVM, host and options).
"""
from __future__ import annotations

import atexit
import collections
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import BinaryIO, Sequence

from tracer.runtime import jit

# Below this many modules the worker's start (a Python process importing LLVM, ~0.3 s of CPU)
# costs more than it saves.
MIN_MODULES = 16
_LENGTH = struct.Struct("<Q")
Job = tuple[str, dict]  # a module's LLVM IR text and the options of jit.compile_object


def _write(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _read(stream: BinaryIO) -> object:
    header = stream.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
        raise EOFError("the compile worker closed its pipe")
    (length,) = _LENGTH.unpack(header)
    return pickle.loads(stream.read(length))


class Worker:
    """The worker process and the pipes to it; `compile` is used by one thread at a time."""

    def __init__(self):
        self.owner = os.getpid()  # a forked child starts its own worker
        import tracer  # the worker imports the same tracer: from this folder
        root = os.path.dirname(os.path.dirname(os.path.abspath(tracer.__file__)))
        command = (f"import sys; sys.path.insert(0, {root!r}); "
                   "from tracer.runtime.compile_worker import serve; serve()")
        self.process = subprocess.Popen([sys.executable, "-c", command], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self.cpu_seconds = 0.0  # the worker's CPU time so far, as it last reported it
        atexit.register(self.close)

    def close(self, kill: bool = False) -> None:
        """End the worker (closing its pipe ends it) and wait for it."""
        if kill:
            self.process.kill()
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
        self.process.stdout.close()

    def compile(self, job: Job) -> bytes | None:
        """The object code of `job`, or None if the worker failed (it is then not used again)."""
        try:
            _write(self.process.stdin, job)
            object_code, self.cpu_seconds = _read(self.process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            object_code = None
        if object_code is None:
            _stop(self)
        return object_code


_worker: Worker | None = None
_worker_lock = threading.Lock()


def start() -> Worker | None:
    """The worker, started if it is not running; None on a machine with one processor for this
    process, or if it cannot start."""
    global _worker
    with _worker_lock:
        if _worker is not None and _worker.owner == os.getpid():
            return _worker
        _worker = None
        if len(os.sched_getaffinity(0)) < 2:
            return None
        try:
            _worker = Worker()
        except OSError as error:
            jit.LOG.debug("no compile worker: %s", error)
        return _worker


def _stop(worker: Worker) -> None:
    global _worker
    with _worker_lock:
        if _worker is worker:
            _worker = None
    worker.close(kill=True)


def worker_cpu_seconds() -> float:
    """The CPU time the running worker has spent, as it last reported it (0 without one)."""
    worker = _worker
    return worker.cpu_seconds if worker is not None and worker.owner == os.getpid() else 0.0


def compile_objects(jobs: Sequence[Job]) -> list[bytes]:
    """The object code of each job, in order: compiled here and, from MIN_MODULES modules on, in
    the worker too."""
    results: list[bytes | None] = [None] * len(jobs)
    worker = start() if len(jobs) >= MIN_MODULES else None
    pending = collections.deque(range(len(jobs)))
    lock = threading.Lock()

    def feed_worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                index = pending.pop()
            object_code = worker.compile(jobs[index])
            if object_code is None:
                with lock:
                    pending.append(index)
                return
            results[index] = object_code

    feeder = threading.Thread(target=feed_worker, daemon=True) if worker is not None else None
    if feeder is not None:
        feeder.start()
    try:
        while True:
            with lock:
                if not pending:
                    break
                index = pending.popleft()
            results[index] = jit.compile_object(jobs[index][0], **jobs[index][1])
    except BaseException:
        with lock:
            pending.clear()
        raise
    finally:
        if feeder is not None:
            feeder.join()
    for index in pending:  # left by a worker that failed
        results[index] = jit.compile_object(jobs[index][0], **jobs[index][1])
    return results


def serve() -> None:
    """The worker's loop: a job from stdin, its object code (None if it fails) and the worker's
    CPU time to stdout, until stdin closes."""
    import time
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what LLVM or Python might print goes to stderr, never into the pipe
    while True:
        try:
            text, options = _read(requests)
        except EOFError:
            return
        try:
            object_code = jit.compile_object(text, **options)
        except Exception:  # noqa: BLE001 - the parent compiles it again and reports the error
            object_code = None
        _write(replies, (object_code, time.process_time()))
