"""What the code generator does to keep LLVM's compile time down, checked for what it must not
change: the values (against numpy; every compiled call is also checked against the reference
interpreter by tests/conftest.py) and the vectorized loops."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tracer as tr


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def test_math_of_scalars_is_called_out_of_line_before_the_vector_loop():
    """AdamW's bias corrections: `1 - beta ** step` of 0-d tensors, used by every element. The
    pow (and the exp) are called, not inlined, and LLVM hoists the calls out of the loop, which
    still vectorizes."""
    @tr.trace
    def update(x, beta, count):
        return x * (1 - beta ** count) + tr.exp(beta)

    x = np.random.default_rng(0).normal(size=1003).astype(np.float32)  # and a scalar remainder
    beta, count = np.array(0.9, np.float32), np.array(7.0, np.float32)
    expected = x * (1 - np.float32(0.9) ** np.float32(7)) + np.exp(np.float32(0.9))
    np.testing.assert_allclose(update(x, beta, count).numpy(), expected, rtol=2e-7, atol=0)
    text = update.ir(x, beta, count, stage="llvm")
    kernel = text[text.index("define internal"):]
    calls = [kernel.index(f"@tracer.{name}.f32(float") for name in ("pow", "exp")]
    assert max(calls) < kernel.index("vector.body:")
    vector_body = kernel[kernel.index("vector.body:"):]
    assert re.search(r"<\d+ x float>", vector_body[:vector_body.index("\n\n")])


def test_math_of_elements_is_inlined_and_vectorized():
    """The same functions of each element stay inline: the loop vectorizes through them."""
    @tr.trace
    def update(x, beta):
        return beta ** x + tr.exp(x)

    x = np.random.default_rng(1).normal(size=1003).astype(np.float32)
    beta = np.array(0.9, np.float32)
    expected = np.float32(0.9) ** x + np.exp(x)
    np.testing.assert_allclose(update(x, beta).numpy(), expected, rtol=3e-7, atol=0)
    text = update.ir(x, beta, stage="llvm")
    kernel = text[text.index("define internal"):]
    assert "call fastcc float @tracer." not in kernel and "call float @tracer." not in kernel
    assert re.search(r"<\d+ x float>", kernel)
