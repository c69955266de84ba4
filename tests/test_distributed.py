"""tr.distributed and DistributedDataParallel: in this process (a world of one, as a script started
without mpiexec) and on two ranks under `mpiexec -n 2` (tests/distributed_worker.py), against
values computed by hand from every rank's data and, for DDP's steps, PyTorch on the whole batch."""
import os
import subprocess
import sys

import numpy as np
import pytest

import tracer as tr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pytest.importorskip("mpi4py", reason="the `distributed` extra (mpi4py, mpich) is not installed")
dist = tr.distributed


def run_ranks(script: str, *arguments: str, ranks: int = 2,
              timeout: float = 300) -> subprocess.CompletedProcess:
    # as a user starts them: tracer.distributed gives each rank's compiled code its share of the
    # cores (the worker checks it), which runs OpenBLAS on one thread (runtime/pool.py)
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("TRACER_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    environment["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "examples")])
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, os.path.join(ROOT, script),
                           *arguments], capture_output=True, text=True, timeout=timeout, env=environment)


@pytest.mark.parametrize("mode", ["collectives", "ddp", "mismatch"])
def test_two_ranks(mode):
    result = run_ranks("tests/distributed_worker.py", mode)
    assert result.returncode == 0, result.stdout + result.stderr
    # every check passed on both ranks (the ranks' lines may interleave)
    expected = {"collectives": 1 + 11 + 2 + 1 + 1, "ddp": 2, "mismatch": 1}[mode]
    assert result.stdout.count("ok ") == 2 * expected, result.stdout


def test_a_failing_rank_ends_the_job_with_its_error():
    result = run_ranks("tests/distributed_worker.py", "fail")  # rank 0 waits in a barrier: without the abort this would hang
    assert result.returncode != 0
    assert "rank 1 fails on purpose" in result.stderr


def test_a_failing_rank_interrupted_while_it_waits_still_ends_the_job():
    """The failing rank waits a second before MPI_Abort (for mpiexec to forward its report); an
    interrupt (SIGINT) arriving then raised KeyboardInterrupt inside the hook, which skipped the
    abort, so rank 0 waited in its barrier forever."""
    result = run_ranks("tests/distributed_worker.py", "interrupted_fail", timeout=120)
    assert result.returncode != 0
    assert "rank 1 fails on purpose" in result.stderr


@pytest.fixture
def world_of_one():
    if not dist.is_initialized():
        dist.init_process_group(backend="mpi")
    yield
    # the group stays: MPI cannot be initialized twice in a process


def test_not_initialized_is_refused():
    if dist.is_initialized():
        pytest.skip("another test initialized the group in this process")
    with pytest.raises(tr.SettingError, match="init_process_group"):
        dist.get_rank()


def test_world_of_one(world_of_one):
    assert (dist.get_rank(), dist.get_world_size(), dist.is_initialized()) == (0, 1, True)
    x = tr.tensor([1.0, -0.0, float("nan")])
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    assert x.numpy().tobytes() == np.array([1.0, -0.0, np.nan], np.float32).tobytes()
    shard = dist.shard(7, epoch=1, seed=2)
    assert sorted(shard.numpy().tolist()) == list(range(7))
    assert shard.numpy().tolist() == np.random.default_rng(3).permutation(7).tolist()
    with pytest.raises(tr.ArgumentError, match="AVG"):
        dist.all_reduce(tr.tensor([1, 2]), op=dist.ReduceOp.AVG)
    with pytest.raises(tr.ArgumentError, match="MPI only"):
        dist.init_process_group(backend="nccl")


def test_traced_all_reduce_is_a_node_of_every_stage(world_of_one):
    @tr.trace
    def step(x):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x.sum()

    x = tr.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert step(x).item() == 10.0
    for stage in ("traced", "grad", "optimized", "fused", "loops", "llvm"):
        text = step.ir(x, stage=stage)
        assert ("tracer_mpi_allreduce" if stage == "llvm" else "all_reduce") in text, stage


def test_all_reduce_gradient_is_the_sum_of_cotangents(world_of_one):
    # y = all_reduce(x) is the sum over ranks: alone, its gradient passes unchanged
    from tracer.dispatch import apply

    x = tr.tensor([1.0, 2.0], requires_grad=True)
    y = apply("all_reduce", [x], op="sum")
    (y * tr.tensor([3.0, 4.0])).sum().backward()
    assert x.grad.numpy().tolist() == [3.0, 4.0]


def test_the_example_takes_the_steps_of_one_process_on_the_whole_batch():
    from two_layer_net import train

    result = run_ranks("examples/distributed_two_layer.py")
    assert result.returncode == 0, result.stdout + result.stderr
    printed = [float(line.split(":")[2].split()[0]) for line in result.stdout.splitlines()
               if line.startswith("Step:")]
    alone = [loss for t, loss in enumerate(train(tr.trace(step_of_one), report=lambda _: None), 1)
             if t % 100 == 0 or t == 1]
    assert len(printed) == 6
    # The ranks' halves of the loss and gradients add up in another order than one process's
    # float32 sums. The loss falls from 3e7 to 4e-5: late losses are differences of nearly equal
    # predictions and targets, whose relative rounding error grows as they shrink (two runs of
    # one process with 1 and 2 OpenBLAS threads differ by 0.7% at step 500).
    np.testing.assert_allclose(printed[:4], alone[:4], rtol=2e-3)
    np.testing.assert_allclose(printed[4:], alone[4:], rtol=3e-2)


def step_of_one(x, y, w1, w2, learning_rate):
    from two_layer_net import step
    return step(x, y, w1, w2, learning_rate)


def test_independent_all_reduces_become_one(world_of_one):
    # Horovod's tensor fusion in the compiled step: the small sums that depend on no other
    # all_reduce are one all_reduce of their concatenation; the max, the sums of sums and the
    # large sum (whose copy would cost more than a call) stay apart
    from tracer.ir.collectives import FUSED_BYTES

    @tr.trace
    def step(a, b, c, large):
        dist.all_reduce(a)
        dist.all_reduce(b)
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        dist.all_reduce(large)
        total = a.sum() + b.sum()
        dist.all_reduce(total)
        d = b * 3
        dist.all_reduce(d)
        return a * 2, b - 1, c, total, d, large

    values = [np.array([[1.5, -0.0], [np.inf, 2.0]], np.float32),
              np.array([-0.0, np.nan, 3.0], np.float32), np.array([4.0, -5.0], np.float32),
              np.arange(FUSED_BYTES // 4 + 1, dtype=np.float32)]
    optimized = step.ir(*map(tr.tensor, values), stage="optimized")
    # a and b; c's max; large; total and d
    assert optimized.count("= all_reduce ") == 4, optimized
    results = step(*(tr.tensor(v) for v in values))
    a, b, c, large = values
    total = np.float32(a.sum() + b.sum())
    expected = [a * 2, b - 1, c, total, b * 3, large]
    for got, wanted in zip(results, expected):  # bitwise: -0.0 and nan come through
        assert got.numpy().tobytes() == np.asarray(wanted, np.float32).tobytes()
