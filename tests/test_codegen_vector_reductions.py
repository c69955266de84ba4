"""Row maxima and minima over rows long enough for the loop vectorizer, of values a select of
+-inf feeds (a masked softmax's row max: codegen/render_kernel.py freezes the element so that the loop
vectorizes): the same values as numpy, nan anywhere in a row included. Every compiled call is
also checked against the reference interpreter (tests/conftest.py)."""
from __future__ import annotations

import numpy as np
import pytest

import tracer as tr

ROWS, LENGTH = 12, 203  # an odd length: a vector loop and its scalar remainder


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))


def awkward_rows(dtype) -> tuple[np.ndarray, np.ndarray]:
    """Scores with nan at the start, middle and end of rows, +-inf, signed zeros and a row
    masked entirely; the mask keeps a lower triangle and some scattered elements."""
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(ROWS, LENGTH)).astype(dtype)
    mask = (np.tri(ROWS, LENGTH, 150, dtype=bool) | (rng.random((ROWS, LENGTH)) < 0.1))
    scores[0, 0] = scores[1, LENGTH // 2] = scores[2, LENGTH - 1] = np.nan
    mask[2, LENGTH - 1] = True
    scores[3, 7], scores[4, 11] = np.inf, -np.inf
    scores[5, :] = -0.0
    scores[6, 100:] = 0.0
    mask[7, :] = False
    scores[8, :] = np.nan
    mask[8, 5] = True
    return scores, mask.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("largest", [True, False], ids=["max", "min"])
def test_masked_row_extremes_match_numpy(dtype, largest):
    fill = -np.inf if largest else np.inf

    @tr.trace
    def extremes(scores, mask):
        masked = (scores * 0.5).masked_fill(mask == 0, fill)
        return masked.amax(dim=-1) if largest else masked.amin(dim=-1)

    scores, mask = awkward_rows(dtype)
    expected = np.where(mask == 0, dtype(fill), scores * dtype(0.5))
    expected = expected.max(axis=-1) if largest else expected.min(axis=-1)
    result = extremes(scores, mask).numpy()
    assert np.isnan(result[[0, 1, 2, 8]]).all()
    np.testing.assert_array_equal(result, expected)
