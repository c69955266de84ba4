"""Every error of the issue's "Errors" list: a tr.TracerError subclass whose message names the
user's file:line (this file) and says what to do; afterwards the user's tensors, parameters and
.grad are unchanged -- eagerly and under @tr.trace."""
import inspect
import os
import types

import numpy as np
import pytest

import tracer as tr

FILE = os.path.basename(__file__)


def here() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def def_line(function) -> int:
    return function.__code__.co_firstlineno


class State:
    """Copies of tensors' data and .grad, to compare after an error."""

    def __init__(self, *tensors):
        self.tensors = tensors
        self.copies = [(t.detach().numpy().copy(), None if t.grad is None else t.grad.numpy().copy(),
                        t.requires_grad) for t in tensors]

    def assert_unchanged(self):
        for t, (data, grad, requires_grad) in zip(self.tensors, self.copies):
            np.testing.assert_array_equal(t.detach().numpy(), data)
            assert t.requires_grad == requires_grad
            if grad is None:
                assert t.grad is None
            else:
                np.testing.assert_array_equal(t.grad.numpy(), grad)


def params():
    """Two parameters (one with an existing .grad) and an input."""
    w = tr.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    b = tr.tensor([0.1, 0.2], requires_grad=True)
    b.grad = tr.tensor([7.0, 8.0])
    x = tr.tensor([[1.0, 2.0], [3.0, -4.0]])
    return w, b, x


def check_message(error, line, *fragments):
    message = str(error.value)
    assert isinstance(error.value, tr.TracerError)
    assert f"{FILE}:{line}" in message, (line, message)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# Custom Function backward errors ------------------------------------------------------------------------
class TooFew(tr.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g


class TooMany(tr.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


class WrongShape(tr.Function):
    @staticmethod
    def forward(ctx, x, w):
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g, g.sum(0)


class GradForNumber(tr.Function):
    @staticmethod
    def forward(ctx, w, scale):
        return w * scale

    @staticmethod
    def backward(ctx, g):
        return g * 2, g


BACKWARD_ERRORS = [
    (TooFew, lambda F, x, w, b: F.apply(x, w), ["TooFew.backward", "returned 1", "2 input"]),
    (TooMany, lambda F, x, w, b: F.apply(w), ["TooMany.backward", "returned 2", "1 input"]),
    (WrongShape, lambda F, x, w, b: F.apply(x, w),
     ["WrongShape.backward", "'w'", "[2]", "[2, 2]"]),
    (GradForNumber, lambda F, x, w, b: F.apply(w, 2.0),
     ["GradForNumber.backward", "'scale'", "not a tensor", "None"]),
]


@pytest.mark.parametrize("F,call,fragments", BACKWARD_ERRORS, ids=[e[0].__name__ for e in BACKWARD_ERRORS])
def test_backward_errors_eager(F, call, fragments):
    w, b, x = params()
    state = State(w, b, x)
    y = (call(F, x, w, b) + b).sum()
    with pytest.raises(tr.FunctionBackwardError) as error:
        y.backward()
    # the backward's definition line, where the fix goes
    check_message(error, def_line(F.backward), *fragments)
    state.assert_unchanged()           # b's existing .grad did not get the gradient of `+ b`


@pytest.mark.parametrize("F,call,fragments", BACKWARD_ERRORS, ids=[e[0].__name__ for e in BACKWARD_ERRORS])
def test_backward_errors_traced(F, call, fragments):
    w, b, x = params()
    state = State(w, b, x)

    @tr.trace
    def step(x, w, b):
        (call(F, x, w, b) + b).sum().backward()
        with tr.no_grad():
            w.sub_(0.1 * w.grad)

    with pytest.raises(tr.FunctionBackwardError) as error:
        step(x, w, b)
    check_message(error, def_line(F.backward), *fragments)
    state.assert_unchanged()
    assert step.cache_info().size == 0


def test_r_style_backward_must_return_a_dict_of_known_names():
    f = tr.autograd_function(forward=lambda ctx, a: a * 2, backward=lambda ctx, g: [g * 2])
    line = here() - 1
    w, b, x = params()
    with pytest.raises(tr.FunctionBackwardError) as error:
        f(w).sum().backward()
    check_message(error, line, "dict")
    g = tr.autograd_function(forward=lambda ctx, a: a * 2, backward=lambda ctx, g: {"b": g})
    line = here() - 1
    with pytest.raises(tr.FunctionBackwardError) as error:
        tr.trace(lambda w: g(w).sum().backward())(w)
    check_message(error, line, "'b'")
    assert w.grad is None


# Reading a traced value ---------------------------------------------------------------------------------
def test_python_if_on_traced_value():
    w, b, x = params()
    state = State(w, b, x)

    @tr.trace
    def f(x, w):
        y = x * w
        if (y > 0).sum() > 2:
            return y
        return -y

    line = def_line(f.python_function) + 3
    with pytest.raises(tr.TracingError) as error:
        f(x, w)
    check_message(error, line, "tr.where")
    state.assert_unchanged()


@pytest.mark.parametrize("read", ["item", "numpy", "bool", "float", "tolist"])
def test_reading_a_traced_value(read):
    w, b, x = params()
    state = State(w, b, x)

    @tr.trace
    def f(x, w, b):
        y = (x @ w).sum()
        y.backward()
        with tr.no_grad():
            w.sub_(0.1 * w.grad)            # would change w if the call had completed
        value = {"item": lambda: y.item(), "numpy": lambda: y.detach().numpy(),
                 "bool": lambda: bool(y), "float": lambda: float(y), "tolist": lambda: y.tolist()}
        return value[read]()

    # the line of the lambda that reads the value
    line = def_line(f.python_function) + (6 if read in ("item", "numpy") else 7)
    with pytest.raises(tr.TracingError) as error:
        f(x, w, b)
    check_message(error, line, "traced", "return the tensor")
    state.assert_unchanged()


def test_while_loop_on_traced_value():
    @tr.trace
    def f(x):
        while x.sum() < 10:
            x = x * 2
        return x

    line = def_line(f.python_function) + 2
    with pytest.raises(tr.TracingError) as error:
        f(tr.tensor([1.0]))
    check_message(error, line)


# In-place change of a saved tensor ------------------------------------------------------------------------
class SavesInput(tr.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_inplace_change_of_saved_tensor_eager():
    w, b, x = params()
    h = w * 1.0
    y = SavesInput.apply(h).sum()
    h.add_(1.0)
    changed_line = here() - 1
    state = State(w, b, x)
    with pytest.raises(tr.InplaceError) as error:
        y.backward()
    check_message(error, changed_line, "SavesInput.backward", "saved tensor", "mark_dirty", "clone")
    state.assert_unchanged()


def test_inplace_change_of_saved_tensor_traced():
    w, b, x = params()
    state = State(w, b, x)

    @tr.trace
    def f(w, b):
        h = w * 1.0
        y = (SavesInput.apply(h) + b).sum()
        h.mul_(3.0)
        y.backward()

    changed_line = def_line(f.python_function) + 4
    with pytest.raises(tr.InplaceError) as error:
        f(w, b)
    check_message(error, changed_line, "SavesInput.backward", "saved tensor")
    state.assert_unchanged()


def test_inplace_change_of_tensor_saved_by_builtin_op():
    w, b, x = params()
    h = w * 1.0
    y = (h * w).sum()
    h.sub_(0.5)
    changed_line = here() - 1
    state = State(w, b, x)
    with pytest.raises(tr.InplaceError) as error:
        y.backward()
    check_message(error, changed_line, "clone")
    state.assert_unchanged()


def test_inplace_on_leaf_requiring_grad_outside_no_grad():
    w, b, x = params()
    state = State(w, b, x)
    with pytest.raises(tr.InplaceError) as error:
        w.sub_(0.1)
    check_message(error, here() - 1, "no_grad")
    state.assert_unchanged()

    @tr.trace
    def f(w):
        w.sub_(0.1)

    with pytest.raises(tr.InplaceError) as error:
        f(w)
    check_message(error, def_line(f.python_function) + 2, "no_grad")
    state.assert_unchanged()


# Unsupported argument types --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [{1, 2}, np.array([1 + 2j]), np.array(["a"]), [[1.0], {3}]],
                         ids=["set", "complex", "str_array", "nested_set"])
def test_unsupported_argument_type_traced(bad):
    w, b, x = params()
    state = State(w, b, x)

    @tr.trace
    def f(w, bad):
        with tr.no_grad():
            w.add_(1.0)
        return w

    with pytest.raises(tr.ArgumentError) as error:
        f(w, bad)
    check_message(error, here() - 1)
    state.assert_unchanged()


def test_unsupported_argument_type_eager():
    w, b, x = params()
    state = State(w, b, x)
    for bad in ("abc", None, object()):
        with pytest.raises(tr.ArgumentError) as error:
            w * bad
        check_message(error, here() - 1)
    with pytest.raises(tr.ArgumentError) as error:
        tr.tensor(["a", "b"])
    check_message(error, here() - 1)
    with pytest.raises(tr.ArgumentError) as error:
        tr.zeros(2, dtype=np.complex64)
    check_message(error, here() - 1)
    state.assert_unchanged()


def test_returning_a_non_tensor_from_trace():
    with pytest.raises(tr.ArgumentError):
        tr.trace(lambda x: [x, {1}])(tr.tensor([1.0]))


# Incompatible shapes ----------------------------------------------------------------------------------------
SHAPE_ERRORS = [
    ("add", lambda x, w, b: x + tr.zeros(3)),
    ("mm", lambda x, w, b: x.mm(tr.zeros(3, 2))),
    ("matmul", lambda x, w, b: x @ tr.zeros(3)),
    ("reshape", lambda x, w, b: x.reshape(3, 2)),
    ("expand", lambda x, w, b: b.expand(2, 3)),
    ("where", lambda x, w, b: tr.where(x > 0, x, tr.zeros(3))),
    ("index", lambda x, w, b: x[0, 0, 0]),
    ("inplace", lambda x, w, b: x.add_(tr.zeros(2, 2, 2))),
    ("setitem", lambda x, w, b: x.__setitem__((slice(None), 0), tr.zeros(3))),
    ("mask", lambda x, w, b: x.__setitem__(tr.tensor([True, False, True]), 0.0)),
    ("permute", lambda x, w, b: x.permute(0, 1, 2)),
]


@pytest.mark.parametrize("name,op", SHAPE_ERRORS, ids=[s[0] for s in SHAPE_ERRORS])
def test_incompatible_shapes(name, op):
    w, b, x = params()
    state = State(w, b, x)
    with pytest.raises(tr.ShapeMismatchError) as error:
        op(x, w, b)
    check_message(error, def_line(op))        # the line of the operation in SHAPE_ERRORS
    state.assert_unchanged()

    @tr.trace
    def f(x, w, b):
        with tr.no_grad():
            w.add_(1.0)
        (w * b).sum().backward()
        return op(x, w, b)

    with pytest.raises(tr.ShapeMismatchError) as error:
        f(x, w, b)
    check_message(error, def_line(op))
    state.assert_unchanged()


def test_every_error_class_is_a_tracer_error():
    for cls in (tr.ShapeMismatchError, tr.TracingError, tr.InplaceError, tr.FunctionBackwardError,
                tr.ArgumentError, tr.GradcheckError):
        assert issubclass(cls, tr.TracerError)


def test_backward_twice_without_retain_graph():
    w, b, x = params()
    y = (w * w).sum()
    y.backward()
    state = State(w, b, x)
    with pytest.raises(tr.TracerError) as error:
        y.backward()
    assert "retain_graph" in str(error.value)
    state.assert_unchanged()


def test_traced_tensor_escaping():
    kept = []

    @tr.trace
    def f(x):
        y = x * 2
        kept.append(y)
        return y

    with pytest.raises(tr.TracingError) as error:
        f(tr.tensor([1.0]))
    check_message(error, def_line(f.__wrapped__) + 2, "kept[0]", "return the tensors")  # when traced
    with pytest.raises(tr.TracingError) as error:
        kept[0] + 1
    check_message(error, here() - 1, "return it")

    @tr.trace
    def g(x):
        z = x * 3
        kept.append(types.SimpleNamespace(z=z))  # a bag of settings, walked: found when traced
        return z

    with pytest.raises(tr.TracingError) as error:
        g(tr.tensor([1.0]))
    check_message(error, def_line(g.__wrapped__) + 2, "kept[1].z", "return the tensors")

    @tr.trace
    def h(x):
        w = x * 4
        kept.append(types.MappingProxyType({"w": w}))  # a library object, not walked: when used
        return w

    h(tr.tensor([1.0]))
    with pytest.raises(tr.TracingError) as error:
        kept[2]["w"] + 1
    check_message(error, here() - 1, "return it")


def test_random_integers_inside_trace():
    # (tr.randn and tr.rand draw anew on every call there: tests/test_random.py)
    with pytest.raises(tr.TracingError) as error:
        tr.trace(lambda x: x + tr.randint(0, 5, (1,)))(tr.tensor([1.0]))
    check_message(error, here() - 1, "argument")


def test_captured_tensor_computed_outside_from_tensors_requiring_grad():
    w, b, x = params()
    doubled = w * 2  # not a leaf: the compiled code cannot send its gradient on to w
    with pytest.raises(tr.TracingError) as error:
        tr.trace(lambda x: (x * doubled).sum())(x)
    check_message(error, here() - 1, "detach()")
    assert doubled._trace is None and doubled.grad_fn is not None  # left as it was


class SavesOutput(tr.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


def test_inplace_change_of_a_saved_output_after_it_was_returned():
    # PyTorch raises here; reading the changed buffer would give a silently wrong gradient
    w, b, x = params()
    y = SavesOutput.apply(w)
    with tr.no_grad():
        y.add_(1.0)
    changed_line = here() - 1
    state = State(w, b, x)
    with pytest.raises(tr.InplaceError) as error:
        y.sum().backward()
    check_message(error, changed_line, "SavesOutput.backward", "output")
    state.assert_unchanged()

    def f(w):
        y = SavesOutput.apply(w)
        y.mul_(2.0)
        y.sum().backward()

    for run in (f, tr.trace(f)):
        with pytest.raises(tr.InplaceError) as error:
            run(w)
        check_message(error, def_line(f) + 2, "SavesOutput.backward")
        state.assert_unchanged()


def test_in_place_change_of_a_where_condition_before_backward():
    # the gradient of where(m, x, 0) goes where m holds: changing m first is an error, as in
    # PyTorch, not a silently wrong gradient
    x = tr.tensor([1.0, -1.0, 2.0], requires_grad=True)
    mask = x.detach() > 0
    y = tr.where(mask, x, 0.0)
    mask.fill_(False)
    with pytest.raises(tr.InplaceError, match="test_api_errors.py"):
        y.sum().backward()
    assert x.grad is None
