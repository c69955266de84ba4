"""Run on every rank by tests/test_distributed.py under `mpiexec -n 2`; each check asserts on
this rank and prints `ok <name>`; an AssertionError ends the job (tracer.distributed aborts it).

    mpiexec -n 2 python tests/distributed_worker.py collectives|ddp|fail|interrupted_fail|mismatch
"""
import functools
import os
import signal
import sys
import threading

import numpy as np

import tracer as tr
import tracer.distributed as dist
from tracer import nn

dist.init_process_group(backend="mpi")
RANK, WORLD = dist.get_rank(), dist.get_world_size()


def rank_values(rank: int, dtype, nan: bool = True) -> np.ndarray:
    """What rank `rank` contributes: distinct per rank, with a -0.0, an inf and (unless not `nan`)
    a nan in floats. MPI's MAX and MIN of a nan follow the library (MPICH's skip it, PyTorch's
    MPI backend gives the same), so those are checked without one."""
    values = np.array([rank + 1.5, -2.0 * rank, 3.0, 10.0 * (rank % 2)], dtype=np.float64)
    if np.dtype(dtype).kind == "f":
        values = np.concatenate([values, [-0.0, np.inf if rank == 0 else 1.0,
                                          np.nan if rank == WORLD - 1 and nan else 2.0]])
    return values.astype(dtype)


def expected(op: str, dtype) -> np.ndarray:
    stacked = np.stack([rank_values(r, dtype, op in ("sum", "avg")) for r in range(WORLD)])
    if op == "sum":
        return stacked.sum(axis=0, dtype=dtype)
    if op == "avg":
        return stacked.sum(axis=0, dtype=dtype) / np.asarray(WORLD, dtype)
    return stacked.max(axis=0) if op == "max" else stacked.min(axis=0)


def check_shared_cores() -> None:
    """Started without TRACER_NUM_THREADS, each rank's compiled code runs on its share of the
    cores (every rank is on this machine)."""
    share = max(1, len(os.sched_getaffinity(0)) // WORLD)
    assert os.environ["TRACER_NUM_THREADS"] == str(share), os.environ["TRACER_NUM_THREADS"]
    print("ok shared cores", flush=True)


def check_collectives() -> None:
    check_shared_cores()
    for dtype in (np.float32, np.float64, np.int64):
        for op in ("sum", "avg", "max", "min"):
            if op == "avg" and dtype == np.int64:
                continue
            reduce_op = getattr(dist.ReduceOp, op.upper())
            values = rank_values(RANK, dtype, op in ("sum", "avg"))
            eager = tr.tensor(values)
            dist.all_reduce(eager, op=reduce_op)

            @tr.trace
            def traced(x, reduce_op=reduce_op):
                dist.all_reduce(x, op=reduce_op)
                return x * 1

            argument = tr.tensor(values)
            result = traced(argument)
            for got in (eager.numpy(), argument.numpy(), result.numpy()):
                np.testing.assert_array_equal(got, expected(op, dtype), err_msg=f"{op} {dtype}")
            assert "all_reduce" in traced.ir(tr.tensor(values), stage="loops")
            print(f"ok all_reduce {op} {np.dtype(dtype).name}", flush=True)
    for dtype in (np.float32, np.int64):
        source = WORLD - 1
        eager = tr.tensor(rank_values(RANK, dtype))
        dist.broadcast(eager, src=source)

        @tr.trace
        def traced_broadcast(x, source=source):
            dist.broadcast(x, src=source)
            return x

        argument = tr.tensor(rank_values(RANK, dtype))
        traced_broadcast(argument)
        for got in (eager.numpy(), argument.numpy()):
            # bitwise: -0.0 stays -0.0 and nan stays nan
            assert got.tobytes() == rank_values(source, dtype).tobytes(), (got, dtype)
        gathered = [tr.zeros(len(rank_values(0, dtype)), dtype=tr.tensor(rank_values(0, dtype)).dtype)
                    for _ in range(WORLD)]
        dist.all_gather(gathered, tr.tensor(rank_values(RANK, dtype)))
        for r, got in enumerate(gathered):
            assert got.numpy().tobytes() == rank_values(r, dtype).tobytes()
        print(f"ok broadcast and all_gather {np.dtype(dtype).name}", flush=True)
    @tr.trace
    def two_sums(x, y):  # one all_reduce of both (ir/collectives.py)
        dist.all_reduce(x)
        dist.all_reduce(y)
        return x, y

    x, y = rank_values(RANK, np.float32), rank_values(RANK, np.float32)[::-1].copy()
    assert two_sums.ir(tr.tensor(x), tr.tensor(y), stage="optimized").count("= all_reduce ") == 1
    # the ranks' elements added in IEEE arithmetic (-0.0 + -0.0 is -0.0; numpy's sum with a
    # dtype starts from +0.0)
    total = functools.reduce(np.add, [rank_values(r, np.float32) for r in range(WORLD)])
    for got, wanted in zip(two_sums(tr.tensor(x), tr.tensor(y)), (total, total[::-1])):
        assert got.numpy().tobytes() == wanted.tobytes(), (got, wanted)
    print("ok fused all_reduce", flush=True)
    indices = [tr.zeros(5, dtype=tr.int64) for _ in range(WORLD)]
    mine = dist.shard(10, epoch=3, seed=7)
    dist.all_gather(indices, tr.cat([mine, tr.full((5 - len(mine),), -1, dtype=tr.int64)]))
    every = sorted(i for t in indices for i in t.numpy().tolist() if i >= 0)
    assert every == list(range(10)), every  # each index on exactly one rank
    print("ok shard", flush=True)


def model_and_batch(rank: int):
    tr.manual_seed(100 + rank)  # different initial weights per rank: DDP broadcasts rank 0's
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)
    return model, x, y


def check_ddp() -> None:
    import torch

    initial = [p.detach().numpy().copy() for p in model_and_batch(0)[0].parameters()]
    model, x, y = model_and_batch(RANK)
    # a buffer made with .view() (a copy in tracer, refused by copy_), as GPT's causal mask is
    model.register_buffer("mask", tr.tril(tr.full((3, 3), RANK + 1.0)).view(1, 3, 3))
    ddp = nn.parallel.DistributedDataParallel(model)
    for p, q in zip(model.parameters(), initial):
        assert p.detach().numpy().tobytes() == q.tobytes()  # broadcast from rank 0 at wrap
    np.testing.assert_array_equal(model.mask.numpy(), np.tril(np.ones((3, 3)))[None])
    print("ok ddp broadcast", flush=True)
    optimizer = tr.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rows = slice(RANK * len(x) // WORLD, (RANK + 1) * len(x) // WORLD)  # this rank's shard

    @tr.trace
    def step(inputs, targets):
        loss = ((ddp(inputs) - targets) ** 2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for _ in range(5):
        step(tr.tensor(x[rows]), tr.tensor(y[rows]))
    assert step.cache_info().misses == 1, step.cache_info()
    assert "all_reduce" in step.ir(tr.tensor(x[rows]), tr.tensor(y[rows]), stage="optimized")
    # bitwise the same parameters on every rank
    for p in model.parameters():
        copies = [tr.zeros(*p.shape) for _ in range(WORLD)]
        dist.all_gather(copies, p.detach())
        assert all(c.numpy().tobytes() == copies[0].numpy().tobytes() for c in copies)
    # and those of one process on the whole batch (PyTorch), to float32 rounding
    reference = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    with torch.no_grad():
        for q, value in zip(reference.parameters(), initial):
            q.copy_(torch.from_numpy(value))
    torch_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        loss = ((reference(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
        loss.backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    print("ok ddp traced steps", flush=True)


def check_fail() -> None:
    if RANK == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()  # rank 0 would wait here forever if the failure did not end the job


def check_interrupted_fail() -> None:
    """As check_fail, and an interrupt reaches the failing rank while it waits to abort."""
    if RANK == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        raise RuntimeError("rank 1 fails on purpose")
    dist.barrier()


def check_mismatch() -> None:
    x = tr.zeros(3 + RANK)
    try:
        dist.all_reduce(x)
    except tr.ArgumentError as error:
        assert "differ between ranks" in str(error), error
        print("ok mismatch refused", flush=True)
        return
    raise AssertionError("a collective of different shapes was not refused")


{"collectives": check_collectives, "ddp": check_ddp, "fail": check_fail,
 "interrupted_fail": check_interrupted_fail, "mismatch": check_mismatch}[sys.argv[1]]()
