"""Compiling many LLVM modules on two processors: a worker process compiles modules from the front
of the list, as soon as they are added (while this process renders the rest), and this process,
once they are all added, compiles from the end, until they meet.

llvmlite holds a lock of its own around LLVM, so threads would take turns; a second process does
not. The worker (runtime/compile_server.py) starts at the first big compile (`start`), imports
while this process fuses and schedules, and stays, idle, for the process's later compiles; it
exits when this process closes the pipe. If it cannot start or dies, this process compiles what
it left. Its object code is what `object_code.compile_object` makes here (the same LLVM, host and
options).
"""
from __future__ import annotations

import atexit
import collections
import os
import pickle
import subprocess
import sys
import threading
from typing import Sequence

from tracer.runtime import jit, object_code, pool
from tracer.runtime.compile_server import read, write

# Below this many modules the worker's start (a Python process importing LLVM, ~0.1 s of CPU)
# costs more than it saves.
MIN_MODULES = 16
# Jobs sent to the worker before their object code is back: it finds the next one waiting when it
# finishes one, rather than waiting for this process to take the object code and send another
# (a thread of this process that renders holds the interpreter's lock for up to 5 ms at a time).
AHEAD = 2
Job = tuple[str, dict]  # a module's LLVM IR text and the options of object_code.compile_object
# What reading a reply raises when the worker is gone or its pipe broken.
_BROKEN = (OSError, ValueError, EOFError, pickle.UnpicklingError)
_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compile_server.py")


class Worker:
    """The worker process and the pipes to it: one thread sends jobs, one receives their object
    code, in the same order."""

    def __init__(self):
        self.owner = os.getpid()  # a forked child starts its own worker
        command = f"import runpy; runpy.run_path({_SERVER!r}, run_name='__main__')"
        self.process = subprocess.Popen([sys.executable, "-c", command], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, close_fds=True)
        self.cpu_seconds = 0.0  # the worker's CPU time so far, as it last reported it
        # The thread pool's module, sent first (`compile_pool_first`): its reply comes before any
        # job's; `receive` keeps it (None if LLVM or the worker failed) for `take_pool`.
        self.pool_sent = self._pool_due = False
        self._pool_code: bytes | None = None
        self.speculative = False  # started ahead of a compilation, none has used it yet (`start`)
        atexit.register(self.close)

    def compile_pool_first(self) -> None:
        """Send the thread pool's module (runtime/pool.py), unless this process or the disk cache
        has it: the worker compiles it as soon as it has imported LLVM, while this process
        still fuses the program, where it was the first job of the program's compilation and
        took ~90 ms of the worker's time while this process rendered the kernels."""
        text = pool.compile_job() if pool.SUPPORTED else None
        if text is not None:
            self.pool_sent = self._pool_due = self.send((text, pool.COMPILE_OPTIONS))

    def take_pool(self) -> bytes | None:
        """The thread pool's object code from `compile_pool_first` (None if it failed), read now
        if no reply was read since. Called with no compilation running."""
        if self._pool_due:
            try:
                self._read_pool()
            except _BROKEN:
                pass
        return self._pool_code

    def _read_pool(self) -> None:
        self._pool_due = False
        self._pool_code, self.cpu_seconds = read(self.process.stdout)

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

    def send(self, job: Job) -> bool:
        """Whether `job` reached the worker."""
        try:
            write(self.process.stdin, job)
            return True
        except (OSError, ValueError):  # (ValueError: the pipe was closed here)
            return False

    def receive(self) -> bytes | None:
        """The object code of the oldest job sent and not yet received; None if the worker failed
        (it is then not used again)."""
        try:
            if self._pool_due:
                self._read_pool()
            compiled, self.cpu_seconds = read(self.process.stdout)
        except _BROKEN:
            compiled = None
        return compiled


_worker: Worker | None = None
_worker_lock = threading.Lock()


def start(threaded: bool = False, speculative: bool = False) -> Worker | None:
    """The worker, started if it is not running; None on a machine with one processor for this
    process, or if it cannot start. A worker started for a program that may split kernels across
    threads (`threaded`) compiles the thread pool first (Worker.compile_pool_first). One started
    `speculative`ly (runtime/pipeline.py: at the end of a large trace, before its program is
    known to miss the disk cache) is stopped by `stop_speculative` unless a compilation uses
    it first: started after the optimizer and the disk cache's lookup, it was still importing
    LLVM when the GPT step's first kernel module came (0.4-0.5 s later on the loaded machine)."""
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
        else:
            _worker.speculative = speculative
            if threaded:
                _worker.compile_pool_first()
        return _worker


def stop_speculative() -> None:
    """Stop the worker if it was started speculatively and no compilation has used it (its
    program was in the disk cache): a disk-cache hit leaves no worker running."""
    worker = _worker
    if worker is not None and worker.owner == os.getpid() and worker.speculative:
        _stop(worker)


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


class Compilation:
    """Jobs compiled as they are added (`add`), by `worker` if there is one, and by this process
    in `finish`, which returns each one's object code in order."""

    def __init__(self, worker: Worker | None):
        self.worker = worker
        if worker is not None:
            worker.speculative = False  # used: kept for the process's later compiles
        self.jobs: list[Job] = []
        self.results: list[bytes | None] = []
        self.pending: collections.deque[int] = collections.deque()  # not yet taken
        self.sent: collections.deque[int] = collections.deque()  # with the worker, in order
        self.changed = threading.Condition()
        self.closed = self.failed = False
        self.threads = [] if worker is None else [
            threading.Thread(target=target, daemon=True) for target in (self._send, self._receive)]
        for thread in self.threads:
            thread.start()

    def add(self, job: Job) -> None:
        with self.changed:
            self.pending.append(len(self.jobs))
            self.jobs.append(job)
            self.results.append(None)
            self.changed.notify_all()

    def _send(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.failed or (self.closed and not self.pending) or (
                    self.pending and len(self.sent) < AHEAD))
                if self.failed or not self.pending:
                    return
                index = self.pending.popleft()
                self.sent.append(index)
                self.changed.notify_all()
            if not self.worker.send(self.jobs[index]):
                return self._fail()

    def _receive(self) -> None:
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.failed or self.sent or (
                    self.closed and not self.pending))
                if self.failed or not self.sent:
                    return
            compiled = self.worker.receive()
            if compiled is None:
                return self._fail()
            with self.changed:
                self.results[self.sent.popleft()] = compiled
                self.changed.notify_all()

    def _fail(self) -> None:
        """The worker failed: what it had is compiled here, and it is stopped."""
        with self.changed:
            self.failed = True
            self.pending.extend(self.sent)
            self.sent.clear()
            self.changed.notify_all()
        _stop(self.worker)

    def finish(self) -> list[bytes]:
        """The object code of every job added, in order: this process compiles the jobs the
        worker has not taken, the last first, then waits for the worker's."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        try:
            while True:
                with self.changed:
                    if not self.pending:
                        self.changed.wait_for(lambda: self.failed or not self.sent)
                        if not self.pending:
                            break
                    index = self.pending.pop()
                text, options = self.jobs[index]
                self.results[index] = object_code.compile_object(text, **options)
        finally:
            self.close()
        return self.results

    def close(self) -> None:
        """Stop: the jobs not yet taken are left, the worker's waited for (its threads end)."""
        with self.changed:
            self.closed = True
            self.pending.clear()
            self.changed.notify_all()
        for thread in self.threads:
            thread.join()


def compile_objects(jobs: Sequence[Job]) -> list[bytes]:
    """The object code of each job, in order: compiled here and, from MIN_MODULES modules on, in
    the worker too."""
    compilation = Compilation(start() if len(jobs) >= MIN_MODULES else None)
    for job in jobs:
        compilation.add(job)
    return compilation.finish()
