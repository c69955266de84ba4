"""`tr.distributed`: data-parallel training on MPI with PyTorch's names (`torch.distributed`).

Run the same script on every process: `mpiexec -n 2 python train.py`. MPI comes from mpi4py with
an MPI library (the `distributed` extra installs mpi4py and the mpich wheel); a process started
without `mpiexec` is a world of size 1, so the script runs unchanged alone.

Every collective is the `all_reduce` primitive (ir/primitives.py), eagerly and inside
`@tr.trace`, where it is a node of the IR that the compiled step calls MPI for itself. The others
are built on it exactly: `broadcast` adds -0.0 (the identity of IEEE addition: x + -0.0 is x for
every x, -0.0 and nan included) from every rank but the source, and `all_gather` sums a buffer of
one slot per rank, each rank filling its own.
"""
from __future__ import annotations

import builtins
import enum
import os
import sys
import time

import numpy as np

from tracer.context import no_grad, state
from tracer.creation import full, tensor as as_tensor_of
from tracer.dispatch import apply
from tracer.errors import ArgumentError, SettingError, TracingError
from tracer.ir.types import is_float
from tracer.tensor import Tensor


class ReduceOp(enum.Enum):
    """How `all_reduce` combines the ranks' tensors (PyTorch's `ReduceOp`)."""
    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"


class _World:
    communicator = None  # mpi4py's COMM_WORLD once init_process_group has run


INSTALL = "pip install 'tracer-compiler[distributed]' (mpi4py and the mpich MPI library)"


def init_process_group(backend: str = "mpi", init_method: str | None = None,
                       world_size: int = -1, rank: int = -1, **options) -> None:
    """Join the job `mpiexec` started (or a world of one without it). Only the MPI backend: the
    ranks and the world size come from MPI, so `world_size` and `rank`, if given, must agree."""
    if backend != "mpi":
        raise ArgumentError(f"backend={backend!r}: tracer.distributed runs on MPI only; use "
                            f"backend='mpi' and start the processes with mpiexec")
    if _World.communicator is not None:
        raise SettingError("init_process_group() called twice: the default process group is "
                           "already initialized")
    try:
        from mpi4py import MPI
    except ImportError:
        raise SettingError(f"tr.distributed needs mpi4py and an MPI library: {INSTALL}") from None
    communicator = MPI.COMM_WORLD
    for name, given, actual in (("world_size", world_size, communicator.Get_size()),
                                ("rank", rank, communicator.Get_rank())):
        if given not in (-1, None, actual):
            raise ArgumentError(f"init_process_group({name}={given}) but MPI says {actual}: "
                                f"mpiexec sets the world")
    _World.communicator = communicator
    if communicator.Get_size() > 1:
        _abort_on_uncaught_exception(communicator)
        _share_cores(communicator, MPI)


def _share_cores(communicator, mpi) -> None:
    """The ranks on one machine share its cores: unless TRACER_NUM_THREADS says otherwise, each
    rank's compiled code runs on its share (two ranks of two threads each on 2 cores took ten
    times as long as one thread each: every rank's threads waited for descheduled peers), and
    OpenBLAS on one thread while it runs (runtime/pool.py)."""
    if "TRACER_NUM_THREADS" in os.environ:
        return
    local = communicator.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    os.environ["TRACER_NUM_THREADS"] = str(max(1, cores // local.Get_size()))
    local.Free()


def _abort_on_uncaught_exception(communicator) -> None:
    """A rank that dies of an exception ends the whole job (MPI_Abort) after printing it, so the
    others never wait for it in a collective (what `python -m mpi4py` does).

    The abort waits a second after the report: mpiexec (hydra 5.0) forwards a rank's stderr a
    line at a time and drops what it has not forwarded when the abort arrives. Measured on
    `mpiexec -n 2 python tests/distributed_worker.py fail`: aborting at once lost the report's
    last lines in 6 of 100 runs (CI saw only its first line), 0.1 s later in 5 of 100, 1 s
    later in none of 60 idle or 60 with both cores busy."""
    previous = sys.excepthook

    def abort(kind, value, traceback):
        try:  # (an interrupt during the wait must not skip the abort: the others would hang)
            previous(kind, value, traceback)
            sys.stderr.flush()
            time.sleep(1.0)
        finally:
            communicator.Abort(1)

    sys.excepthook = abort


def is_initialized() -> builtins.bool:
    return _World.communicator is not None


def destroy_process_group() -> None:
    """Leave the default group (MPI itself finalizes when the process exits)."""
    _World.communicator = None


def _world():
    if _World.communicator is None:
        raise SettingError("the default process group has not been initialized: call "
                           "tr.distributed.init_process_group(backend='mpi') first")
    return _World.communicator


def check_same_on_every_rank(what: str, description) -> None:
    """Raise on every rank, naming the ranks that differ, unless `description` (a picklable
    value) is the same on each: a mismatch is an error here, not a deadlock or a wrong sum in a
    collective later."""
    world = _world()
    descriptions = world.allgather(description)
    differing = [rank for rank, other in enumerate(descriptions) if other != descriptions[0]]
    if differing:
        raise ArgumentError(f"{what} differ between ranks: rank 0 has {descriptions[0]!r}, rank "
                            f"{differing[0]} has {descriptions[differing[0]]!r}; every rank must "
                            f"run the same program on tensors of the same shapes")


def get_rank() -> int:
    return _world().Get_rank()


def get_world_size() -> int:
    return _world().Get_size()


def barrier() -> None:
    """Wait until every rank reaches this call."""
    if state.trace is not None:
        raise TracingError("barrier() inside @tr.trace: a traced step synchronizes through its "
                           "collectives; call barrier() outside the traced function")
    _world().Barrier()


def _op(op) -> ReduceOp:
    try:
        return ReduceOp(op.value if isinstance(op, ReduceOp) else op)
    except ValueError:
        raise ArgumentError(f"op={op!r}: use tr.distributed.ReduceOp.SUM, AVG, MAX or MIN") from None


def _reduced(tensor: Tensor, op: ReduceOp) -> Tensor:
    """The all_reduce of `tensor` over the ranks, a new tensor (no gradient is recorded)."""
    if not isinstance(tensor, Tensor):
        raise ArgumentError(f"expected a Tensor, got {type(tensor).__name__}")
    world = _world().Get_size()
    if world > 1:  # once per call eagerly; traced, once per compile (the trace runs once)
        check_same_on_every_rank("the tensors of a collective",
                                 (op.value, tuple(tensor.shape), str(tensor.dtype)))
    if op is ReduceOp.AVG:
        if not is_float(tensor.dtype):
            raise ArgumentError(f"ReduceOp.AVG of a {tensor.dtype} tensor: use a float tensor, or "
                                f"SUM and divide")
        return apply("all_reduce", [tensor], op="sum") / world
    return apply("all_reduce", [tensor], op=op.value)


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group=None, async_op: builtins.bool = False):
    """Replace `tensor` in place by its sum (average, maximum, minimum) over every rank."""
    if group is not None or async_op:
        raise ArgumentError("all_reduce: groups and async_op are not supported (the whole world, "
                            "synchronously)")
    with no_grad():
        tensor.copy_(_reduced(tensor, _op(op)))


def broadcast(tensor: Tensor, src: int = 0, group=None, async_op: builtins.bool = False):
    """Replace `tensor` in place by rank `src`'s."""
    if group is not None or async_op:
        raise ArgumentError("broadcast: groups and async_op are not supported")
    world = _world()
    if not 0 <= src < world.Get_size():
        raise ArgumentError(f"broadcast(src={src}) in a world of {world.Get_size()} ranks")
    with no_grad():
        mine = tensor if world.Get_rank() == src else full(
            tuple(tensor.shape), -0.0 if is_float(tensor.dtype) else 0, dtype=tensor.dtype)
        tensor.copy_(_reduced(mine, ReduceOp.SUM))


def all_gather(tensor_list: list, tensor: Tensor, group=None, async_op: builtins.bool = False):
    """Fill `tensor_list` (one tensor of `tensor`'s shape per rank) in place with every rank's
    `tensor`, in rank order."""
    world = _world()
    size, rank = world.Get_size(), world.Get_rank()
    if group is not None or async_op:
        raise ArgumentError("all_gather: groups and async_op are not supported")
    if len(tensor_list) != size:
        raise ArgumentError(f"all_gather needs a list of {size} tensors (one per rank), got "
                            f"{len(tensor_list)}")
    with no_grad():
        slots = full((size, *tensor.shape), -0.0 if is_float(tensor.dtype) else 0,
                     dtype=tensor.dtype)
        slots[rank] = tensor  # an exact copy (a cat would add +0.0 to it, losing a -0.0's sign)
        gathered = _reduced(slots, ReduceOp.SUM)
        for r, target in enumerate(tensor_list):
            target.copy_(gathered[r])


def shard(n: int, epoch: int = 0, seed: int = 0, shuffle: builtins.bool = True) -> Tensor:
    """This rank's indices of a data set of `n` items, as `DistributedSampler` partitions them
    without padding: one permutation of range(n) drawn from `seed + epoch` (the same on every
    rank), of which rank r takes positions r, r + world, r + 2 world, ... Each index is on exactly
    one rank; the ranks' counts differ by at most one."""
    world = _world()
    order = (np.random.default_rng(seed + epoch).permutation(n) if shuffle else np.arange(n))
    return as_tensor_of(order[world.Get_rank()::world.Get_size()].astype(np.int64))
