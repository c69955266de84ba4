"""Warm entries (runtime/warm_cache.py): a signature found in the disk cache by its grad stage runs
without being optimized or fused, gives the cold compile's results, gradients and stage texts,
and anything that changes the code -- the program, a setting, the argument signature, a missing
or altered entry -- compiles instead."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tracer as tr
from tracer.runtime import jit, pipeline

ROOT = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 3)).astype(np.float32)
W = RNG.standard_normal((3, 2)).astype(np.float32)
RATE = 0.1


def step(x, w, rate):
    loss = ((x @ w).tanh() ** 2).sum()
    loss.backward()
    with tr.no_grad():
        w.sub_(rate * w.grad)
    gradient = w.grad * 1
    w.grad.zero_()
    return loss, gradient


def expected(x: np.ndarray, w: np.ndarray, scale: float = 1.0) -> tuple[float, np.ndarray]:
    """The loss and gradient of `step` (with `scale` times x @ w), by hand in float64:
    d/dw sum(tanh(s x w)^2) = s x^T (2 tanh (1 - tanh^2))."""
    hidden = np.tanh(scale * x.astype(np.float64) @ w.astype(np.float64))
    return float((hidden ** 2).sum()), scale * x.T.astype(np.float64) @ (
        2 * hidden * (1 - hidden ** 2))


def forget_in_memory(monkeypatch) -> None:
    """What a fresh process has: no code in memory (the disk cache is kept)."""
    monkeypatch.setattr(pipeline, "_compiled", {})


def run(function, x=X, w=W) -> tuple[float, np.ndarray, np.ndarray, dict, dict]:
    """One call of `tr.trace(function)` on copies of x and w: its loss, gradient and updated w, the
    entry's front-end timings and what the call added to the compile counters."""
    before = dict(jit.STATISTICS)
    traced = tr.trace(function)
    weights = tr.tensor(w.copy(), requires_grad=True)
    loss, gradient = traced(tr.tensor(x.copy()), weights, RATE)
    (entry,) = traced._signatures.entries.values()
    counts = {name: jit.STATISTICS[name] - before[name] for name in ("compiled", "disk_hits")}
    return (loss.item(), gradient.numpy(), weights.detach().numpy(), entry.timings, counts)


def test_a_warm_hit_runs_without_optimizing_and_gives_the_cold_results_and_gradients(
        fresh_cache, monkeypatch):
    cold = run(step)
    assert cold[4] == {"compiled": 1, "disk_hits": 0}
    assert "optimize" in cold[3] and "backend" in cold[3]
    forget_in_memory(monkeypatch)
    warm = run(step)
    assert warm[4] == {"compiled": 0, "disk_hits": 1}
    assert set(warm[3]) == {"trace", "grad", "warm"}  # neither optimized nor fused
    loss, gradient = expected(X, W)
    for result in (cold, warm):
        np.testing.assert_allclose(result[0], loss, rtol=1e-5)
        np.testing.assert_allclose(result[1], gradient, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(result[2], W - RATE * gradient, rtol=1e-5, atol=1e-6)
    assert warm[0] == cold[0]  # the same object code
    np.testing.assert_array_equal(warm[1], cold[1])
    np.testing.assert_array_equal(warm[2], cold[2])


def test_a_warm_hit_prints_the_cold_compiles_stages(fresh_cache, monkeypatch):
    """Its optimized graph, fused kernels, loop IR and LLVM text are made again when asked for,
    the same as the cold compile's."""
    stages = ("traced", "grad", "optimized", "fused", "loops", "llvm")
    arguments = (tr.tensor(X), tr.tensor(W, requires_grad=True), RATE)
    cold = tr.trace(step)
    texts = {stage: cold.ir(*arguments, stage=stage) for stage in stages}
    forget_in_memory(monkeypatch)
    before = dict(jit.STATISTICS)
    warm = tr.trace(step)
    assert {stage: warm.ir(*arguments, stage=stage) for stage in stages} == texts
    assert (jit.STATISTICS["compiled"], jit.STATISTICS["disk_hits"]) == (
        before["compiled"], before["disk_hits"] + 1)


def scaled_step(x, w, rate):  # `step` with another program: 2 x @ w
    loss = ((2 * x @ w).tanh() ** 2).sum()
    loss.backward()
    with tr.no_grad():
        w.sub_(rate * w.grad)
    gradient = w.grad * 1
    w.grad.zero_()
    return loss, gradient


def test_a_changed_program_setting_or_signature_compiles(fresh_cache, monkeypatch):
    monkeypatch.setenv("TRACER_NUM_THREADS", "1")
    run(step)
    forget_in_memory(monkeypatch)
    changed = run(scaled_step)
    assert changed[4] == {"compiled": 1, "disk_hits": 0}
    loss, gradient = expected(X, W, scale=2.0)
    np.testing.assert_allclose(changed[0], loss, rtol=1e-5)
    np.testing.assert_allclose(changed[1], gradient, rtol=1e-4, atol=1e-6)
    wider = RNG.standard_normal((6, 3)).astype(np.float32)
    forget_in_memory(monkeypatch)
    reshaped = run(step, x=wider)
    assert reshaped[4] == {"compiled": 1, "disk_hits": 0}
    loss, gradient = expected(wider, W)
    np.testing.assert_allclose(reshaped[0], loss, rtol=1e-5)
    np.testing.assert_allclose(reshaped[1], gradient, rtol=1e-4, atol=1e-6)
    loss, gradient = expected(X, W)
    for setting, value in (("TRACER_CHECK_BOUNDS", "1"), ("TRACER_NUM_THREADS", "2")):
        forget_in_memory(monkeypatch)
        with monkeypatch.context() as changed_setting:
            changed_setting.setenv(setting, value)
            compiled = run(step)
        assert compiled[4] == {"compiled": 1, "disk_hits": 0}, setting
        np.testing.assert_allclose(compiled[0], loss, rtol=1e-5)
        np.testing.assert_allclose(compiled[1], gradient, rtol=1e-4, atol=1e-6)
    forget_in_memory(monkeypatch)
    assert run(step)[4] == {"compiled": 0, "disk_hits": 1}  # the first one's is still there


@pytest.mark.parametrize("damage", ["object code evicted", "warm entry altered"])
def test_a_warm_entry_without_its_code_or_altered_is_not_used(fresh_cache, monkeypatch, damage):
    """Then the program is optimized and its object code compiled (evicted) or found by the
    optimized program (the warm entry's HMAC fails), and the warm entry written again."""
    cold = run(step)
    if damage == "object code evicted":
        for path in fresh_cache.glob("*.o"):
            path.unlink()
    else:
        (path,) = fresh_cache.glob("*.warm")
        data = bytearray(path.read_bytes())
        data[-2] ^= 1  # a byte of the calling convention
        path.write_bytes(bytes(data))
    forget_in_memory(monkeypatch)
    again = run(step)
    assert "optimize" in again[3]
    assert again[4] == ({"compiled": 1, "disk_hits": 0} if damage == "object code evicted"
                        else {"compiled": 0, "disk_hits": 1})
    assert again[0] == cold[0]
    np.testing.assert_array_equal(again[1], cold[1])
    np.testing.assert_array_equal(again[2], cold[2])
    forget_in_memory(monkeypatch)
    warm = run(step)
    assert "optimize" not in warm[3] and warm[4] == {"compiled": 0, "disk_hits": 1}


def gather_step(table, index):
    return (table[index] ** 2).sum()


def test_an_index_out_of_range_in_warm_code_names_the_users_line(fresh_cache, monkeypatch):
    table = tr.tensor(np.arange(15.0, dtype=np.float32).reshape(5, 3))
    messages = []
    for _ in range(2):  # cold, then warm
        forget_in_memory(monkeypatch)
        traced = tr.trace(gather_step)
        assert traced(table, tr.tensor([0, 4])).item() == sum(v * v for v in [0, 1, 2, 12, 13, 14])
        with pytest.raises(tr.IndexOutOfRangeError) as caught:
            traced(table, tr.tensor([0, 5]))
        messages.append(str(caught.value))
    assert "index 5 is out of bounds" in messages[0]
    assert "test_runtime_warm_entries.py:" in messages[0]
    assert messages[1] == messages[0]


FRESH = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tracer as tr

    @tr.trace
    def step(x, rate):
        loss = (x * 2 + 1).pow(2).sum()
        loss.backward()
        with tr.no_grad():
            x.sub_(rate * x.grad)
        return loss

    x = tr.tensor(np.linspace(-1, 1, 16, dtype=np.float32), requires_grad=True)
    loss = step(x, 0.25)
    (entry,) = step._signatures.entries.values()
    print(json.dumps(dict(loss=loss.item(), x=x.detach().numpy().tolist(),
                          steps=sorted(entry.timings), passes=sorted(
                              name for name in ("tracer.ir.fusion", "tracer.ir.memory",
                                                "tracer.ir.rows") if name in sys.modules))))
""")


def test_a_fresh_process_with_a_warm_cache_imports_neither_fusion_nor_memory_planning(tmp_path):
    environment = dict(os.environ, TRACER_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    environment.pop("TRACER_DISABLE_CACHE", None)
    results = [json.loads(subprocess.run(
        [sys.executable, "-c", FRESH], env=environment, cwd=ROOT, check=True,
        capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1])
        for _ in range(2)]
    x = np.linspace(-1, 1, 16, dtype=np.float32).astype(np.float64)
    for result in results:  # d/dx sum((2x+1)^2) = 4(2x+1)
        np.testing.assert_allclose(result["loss"], ((2 * x + 1) ** 2).sum(), rtol=1e-6)
        np.testing.assert_allclose(result["x"], x - 0.25 * 4 * (2 * x + 1), rtol=1e-6, atol=1e-6)
    assert "optimize" in results[0]["steps"]
    assert results[0]["passes"] == ["tracer.ir.fusion", "tracer.ir.memory", "tracer.ir.rows"]
    assert results[1]["steps"] == ["grad", "trace", "warm"]
    assert results[1]["passes"] == []
