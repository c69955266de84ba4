"""User input that is not valid gets a TracerError naming the user's line, eager and traced."""
import numpy as np
import pytest

import tracer as tr

BAD_CALLS = [
    ("sum over a float dim", lambda x: x.sum(1.0)),
    ("max over a tuple of dims", lambda x: x.max((0, 1))),
    ("a dim named twice", lambda x: x.sum((1, -1))),
    ("a zero slice step", lambda x: x[::0]),
    ("a float slice bound", lambda x: x[0.5:]),
    ("a Python bool index", lambda x: x[True]),
    ("a negative size", lambda x: tr.zeros(-2)),
    ("an integer to a negative power", lambda x: tr.tensor([2, 3]) ** -1),
]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("name, call", BAD_CALLS, ids=[name for name, _ in BAD_CALLS])
def test_bad_input_is_a_tracer_error_naming_the_line(name, call, traced):
    x = tr.ones(2, 3)
    function = tr.trace(call) if traced else call
    with pytest.raises(tr.TracerError, match=r"test_api_bad_input\.py:\d+"):
        function(x)


def test_numpy_dims_and_zero_d_reductions():
    x = tr.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(x.sum(np.int64(1)).numpy(), [3.0, 7.0])
    scalar = tr.tensor(3.0)
    assert scalar.mean(0).item() == 3.0 and scalar.sum(-1).item() == 3.0


def test_ragged_data_is_an_argument_error():
    with pytest.raises(tr.ArgumentError, match="test_api_bad_input.py"):
        tr.tensor([[1, 2], [3]])


def test_in_place_change_of_a_read_only_buffer_is_an_argument_error():
    array = np.ones(3, np.float32)
    array.flags.writeable = False
    x = tr.from_numpy(array)
    with pytest.raises(tr.ArgumentError, match="read-only"):
        x.add_(1)
    np.testing.assert_array_equal(array, [1.0, 1.0, 1.0])
