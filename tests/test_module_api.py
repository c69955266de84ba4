"""tr.nn.Module's apply, get_submodule/get_parameter/get_buffer, non-persistent buffers and forward
(pre-)hooks against torch.nn.Module with the same structure and weights (float64): values, order,
errors, and hooks inside @tr.trace, where registering or removing one must trace again."""
import pickle
import warnings

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn
from tracer.nn.module_api import ForwardPreHookError
from tracer.nn.modules import RemovableHandle

rng = np.random.default_rng(11)


def _model(library):
    dtype = tr.float64 if library is nn else torch.float64
    return library.Sequential(library.Linear(4, 6, dtype=dtype), library.GELU(),
                              library.Sequential(library.Linear(6, 6, dtype=dtype),
                                                 library.Tanh()),
                              library.Linear(6, 3, dtype=dtype))


def _pair():
    torch.manual_seed(0)
    theirs = _model(torch.nn)
    ours = _model(nn)
    ours.load_state_dict({name: value.detach().numpy() for name, value in
                          theirs.state_dict().items()})
    return ours, theirs


def _numpy(value):
    return value.detach().numpy()


def _raised(call, *arguments):
    """The type and message of what `call(*arguments)` raises."""
    with pytest.raises(Exception) as caught:
        call(*arguments)
    return type(caught.value), str(caught.value)


def test_apply_visits_children_first_and_returns_self():
    orders = []
    for model in _pair():
        visited = []
        assert model.apply(lambda module, visited=visited: visited.append(
            type(module).__name__)) is model
        orders.append(visited)
    assert orders[0] == orders[1] == ["Linear", "GELU", "Linear", "Tanh", "Sequential",
                                              "Linear", "Sequential"]


def test_apply_initializes_as_torch_does():
    def fill(library):
        def fill_linear(module):
            if isinstance(module, library.Linear):
                library.init.constant_(module.weight, 0.25)
                library.init.zeros_(module.bias)
        return fill_linear

    ours, theirs = _pair()
    ours.apply(fill(nn))
    theirs.apply(fill(torch.nn))
    x = rng.standard_normal((5, 4))
    np.testing.assert_allclose(_numpy(ours(tr.tensor(x))), _numpy(theirs(torch.tensor(x))),
                               rtol=1e-13, atol=1e-15)


def test_get_submodule_parameter_and_buffer_match_torch():
    ours, theirs = _pair()
    for module in (ours, theirs):
        module[2].register_buffer("scale", (tr if module is ours else torch).ones(2,
                                  dtype=(tr if module is ours else torch).float64))
    assert ours.get_submodule("") is ours
    assert ours.get_submodule("2.0") is ours[2][0]
    np.testing.assert_array_equal(_numpy(ours.get_parameter("2.0.weight")),
                                  _numpy(theirs.get_parameter("2.0.weight")))
    assert ours.get_parameter("3.bias") is ours[3].bias
    assert ours.get_buffer("2.scale") is ours[2].scale
    for target in ("5", "2.7.weight", "1.weight", "2.0.nothing"):
        assert _raised(ours.get_submodule, target) == _raised(theirs.get_submodule, target)
    for target in ("2.0.nothing", "2.0.in_features", "2.scale", "2.0", "9.weight"):
        assert _raised(ours.get_parameter, target) == _raised(theirs.get_parameter, target)
    for target in ("2.0.weight", "2.nothing", "2.0.in_features", "4.scale"):
        assert _raised(ours.get_buffer, target) == _raised(theirs.get_buffer, target)


class WithBuffers:
    """A module with a persistent and a non-persistent buffer, for both libraries."""

    @staticmethod
    def make(library):
        lib = tr if library is nn else torch

        class Scaled(library.Module):
            def __init__(self):
                super().__init__()
                self.linear = library.Linear(3, 2, dtype=lib.float64)
                self.register_buffer("mean", lib.zeros(3, dtype=lib.float64))
                self.register_buffer("scale", lib.full((3,), 2.0, dtype=lib.float64),
                                     persistent=False)

            def forward(self, x):
                return self.linear((x - self.mean) * self.scale)
        return Scaled()


def test_non_persistent_buffer_is_a_buffer_but_not_state():
    ours, theirs = WithBuffers.make(nn), WithBuffers.make(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == [
        "mean", "linear.weight", "linear.bias"]
    assert ([name for name, _ in ours.named_buffers()]
            == [name for name, _ in theirs.named_buffers()] == ["mean", "scale"])
    result = ours.load_state_dict({k: _numpy(v) for k, v in theirs.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    x = rng.standard_normal((4, 3))
    np.testing.assert_allclose(_numpy(ours(tr.tensor(x))), _numpy(theirs(torch.tensor(x))),
                               rtol=1e-13)
    ours.float()
    assert ours.scale.dtype == tr.float32 and ours.mean.dtype == tr.float32
    # registering it again as persistent puts it back into the state, as in torch
    ours.register_buffer("scale", ours.scale)
    theirs.register_buffer("scale", theirs.scale)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    # a parameter assigned over a non-persistent buffer is in the state
    ours, theirs = WithBuffers.make(nn), WithBuffers.make(torch.nn)
    ours.scale, theirs.scale = nn.Parameter(tr.ones(3)), torch.nn.Parameter(torch.ones(3))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == [
        "scale", "mean", "linear.weight", "linear.bias"]


def test_register_buffer_errors_match_torch():
    ours, theirs = WithBuffers.make(nn), WithBuffers.make(torch.nn)
    for arguments in (("a.b", None), ("", None), ("linear", None), (3, None),
                      ("extra", np.zeros(2)), ("extra", [1.0])):
        kind, message = _raised(ours.register_buffer, *arguments)
        assert (kind, message.replace("tracer Tensor", "torch Tensor")) == _raised(
            theirs.register_buffer, *arguments)
    assert not hasattr(ours, "extra")


def test_named_members_remove_duplicate_matches_torch():
    names = {}
    for library in (nn, torch.nn):
        shared = library.Linear(2, 2)
        model = library.Sequential(shared, shared, library.BatchNorm1d(2))
        model[2].register_buffer("alias", model[2].running_mean)
        names[library] = [[name for name, _ in listing] for listing in (
            model.named_parameters(), model.named_parameters(remove_duplicate=False),
            model.named_buffers(), model.named_buffers("top", remove_duplicate=False),
            model.named_buffers(recurse=False), model.named_modules(remove_duplicate=False),
            model.named_parameters("p", False))]
    assert names[nn] == names[torch.nn]
    assert "1.weight" in names[nn][1] and "top.2.alias" in names[nn][3]


def _hooks(library, calls):
    """A pre-hook scaling the input, a forward hook shifting the output, recording calls."""
    def scale_input(module, args):
        calls.append("pre")
        return args[0] * 0.5  # a single value: the one positional argument

    def shift_output(module, args, output):
        calls.append("post")
        return output + 0.1 * args[0].mean()

    return scale_input, shift_output


def test_forward_hooks_change_arguments_and_output_as_torch():
    ours, theirs = _pair()
    x = rng.standard_normal((5, 4))
    outputs, calls = [], {nn: [], torch.nn: []}
    for library, model, lib in ((nn, ours, tr), (torch.nn, theirs, torch)):
        pre, post = _hooks(library, calls[library])
        first = model[2].register_forward_pre_hook(pre)
        second = model[2].register_forward_hook(post)
        assert isinstance(first, RemovableHandle if library is nn else
                          torch.utils.hooks.RemovableHandle)
        outputs.append(_numpy(model(lib.tensor(x))))
        first.remove()
        outputs.append(_numpy(model(lib.tensor(x))))
        with second:
            pass  # leaving the block removes the hook
        outputs.append(_numpy(model(lib.tensor(x))))
        first.remove()  # twice is harmless
    for mine, reference in zip(outputs[:3], outputs[3:]):
        np.testing.assert_allclose(mine, reference, rtol=1e-13, atol=1e-14)
    assert calls[nn] == calls[torch.nn] == ["pre", "post", "post"]
    assert not ours[2]._forward_hooks and not ours[2]._forward_pre_hooks


def _keyword_hooks(library, lib):
    seen = []

    class Affine(library.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    def keywords(module, args, kwargs):
        seen.append(("pre kwargs", sorted(kwargs)))
        return (args[0] + 1,), {"scale": kwargs.get("scale", 1.0) * 3}

    module = Affine()
    module.register_forward_pre_hook(lambda m, args: seen.append("pre a"))
    module.register_forward_pre_hook(lambda m, args: seen.append("pre b"), prepend=True)
    module.register_forward_pre_hook(keywords, with_kwargs=True)
    module.register_forward_hook(lambda m, args, kwargs, out: out - kwargs["scale"],
                                 with_kwargs=True)
    module.register_forward_hook(lambda m, args, out: seen.append(("post", len(args))),
                                 prepend=True)
    result = module(lib.tensor([1.0, 2.0], dtype=lib.float64), scale=2.0)
    return seen, _numpy(result).tolist()


def test_hook_order_prepend_and_keywords_match_torch():
    ours, theirs = _keyword_hooks(nn, tr), _keyword_hooks(torch.nn, torch)
    assert ours == theirs
    assert ours[1] == [6.0, 12.0]  # ((x + 1) * 6) - 6


def _failing_forward(library):
    seen = []

    class Failing(library.Module):
        def forward(self, x):
            raise ValueError("forward failed")

    def broken(module, args, output):
        raise KeyError("hook failed")

    module = Failing()
    module.register_forward_hook(lambda m, args, out: seen.append(("always", out)),
                                 always_call=True)
    module.register_forward_hook(lambda m, args, out: seen.append("ordinary"))
    module.register_forward_hook(broken, always_call=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="forward failed"):
            module(1.0)
    return seen, [str(warning.message) for warning in caught]


def test_always_call_hook_runs_when_forward_raises():
    ours = _failing_forward(nn)
    assert ours == _failing_forward(torch.nn)
    assert ours[0] == [("always", None)] and "hook failed" in ours[1][0]


def test_pre_hook_with_kwargs_returning_a_wrong_value_raises_like_torch():
    ours, theirs = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for module in (ours, theirs):
        module.register_forward_pre_hook(lambda m, args, kwargs: args, with_kwargs=True)
    kind, message = _raised(lambda: ours(tr.ones(1, 2)))
    assert kind is ForwardPreHookError and issubclass(kind, RuntimeError)
    assert _raised(lambda: theirs(torch.ones(1, 2)))[0] is RuntimeError
    assert "forward pre-hook must return None or a tuple of (new_args, new_kwargs)" in message


def _training_step(model, library, optimizer):
    def step(x, target):
        optimizer.zero_grad()
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss
    return step


def test_traced_training_step_runs_hooks_and_sees_their_removal():
    """A hooked model trained by a traced step compiles once over several calls and gives
    torch's losses and weights; removing the hook between calls traces again (without the guard
    on the hook dicts, the compiled step kept running the removed hook: the losses after the
    removal differ from torch's)."""
    ours, theirs = _pair()
    steps = {}
    handles = {}
    for library, model, lib in ((nn, ours, tr), (torch.nn, theirs, torch)):
        optimizer = lib.optim.SGD(model.parameters(), lr=0.05)
        pre, post = _hooks(library, [])
        handles[library] = (model[2].register_forward_pre_hook(pre),
                            model[2].register_forward_hook(post))
        steps[library] = _training_step(model, library, optimizer)
    traced = tr.trace(steps[nn])
    data = [(rng.standard_normal((6, 4)), rng.standard_normal((6, 3))) for _ in range(6)]
    for call, (x, target) in enumerate(data):
        if call == 3:
            handles[nn][1].remove()
            handles[torch.nn][1].remove()
        if call == 5:
            handles[nn][0].remove()
            handles[torch.nn][0].remove()
        mine = traced(tr.tensor(x), tr.tensor(target))
        reference = steps[torch.nn](torch.tensor(x), torch.tensor(target))
        np.testing.assert_allclose(mine.item(), reference.item(), rtol=1e-12)
        if call == 2:
            assert traced.cache_info().misses == 1
    assert traced.cache_info().misses == 3  # one trace per set of hooks
    for (name, mine), reference in zip(ours.named_parameters(), theirs.parameters()):
        # (atol: six steps' rounding, at the scale of the largest weights, ~5)
        np.testing.assert_allclose(_numpy(mine), _numpy(reference), rtol=1e-11, atol=1e-11,
                                   err_msg=name)


def test_traced_function_sees_a_hook_registered_after_tracing():
    model = nn.Linear(3, 2, dtype=tr.float64)
    x = tr.tensor(rng.standard_normal((4, 3)))

    @tr.trace
    def forward(x):
        return model(x)

    plain = _numpy(forward(x))
    handle = model.register_forward_hook(lambda m, args, output: output * 3)
    np.testing.assert_allclose(_numpy(forward(x)), plain * 3, rtol=1e-14)
    handle.remove()
    np.testing.assert_allclose(_numpy(forward(x)), plain, rtol=1e-14)
    assert forward.cache_info().misses == 3  # each change of hooks traced again


def test_a_hook_deep_in_a_model_is_guarded():
    """Hooks are guarded however deep the module (beyond the depth the guards' walk of other
    attributes stops at: a Linear seven Sequentials down)."""
    inner = nn.Linear(3, 3, dtype=tr.float64)
    model = inner
    for _ in range(7):
        model = nn.Sequential(nn.Identity(), model)
    x = tr.tensor(rng.standard_normal((2, 3)))

    @tr.trace
    def forward(x):
        return model(x)

    plain, shifted = _numpy(forward(x)), _numpy(inner(x + 1))
    with inner.register_forward_pre_hook(lambda module, args: args[0] + 1):
        np.testing.assert_allclose(_numpy(forward(x)), shifted, rtol=1e-14)
    np.testing.assert_allclose(_numpy(forward(x)), plain, rtol=1e-14)
    assert forward.cache_info().misses == 3


def test_a_change_of_hooks_is_the_recompile_reason_and_spares_functions_without_modules(caplog):
    model = nn.Linear(2, 2, dtype=tr.float64)
    weight = tr.tensor([1.0, 2.0], dtype=tr.float64)

    @tr.trace
    def forward(x):
        return model(x)

    @tr.trace
    def scaled(x):
        return x * weight

    x = tr.ones(1, 2, dtype=tr.float64)
    forward(x), scaled(x)
    with caplog.at_level("INFO", logger="tracer.trace"):
        handle = model.register_forward_hook(lambda module, args, output: output)
        forward(x), scaled(x)
        handle.remove()
    assert "forward hooks or module methods: " in caplog.text
    assert forward.cache_info().misses == 2 and scaled.cache_info().misses == 1


@pytest.mark.parametrize("replaced", ["first layer", "second layer"])
def test_a_library_modules_method_replaced_after_compiling_traces_again(replaced):
    """`lin.forward = f` (a LoRA-style patch, torch.compile's guards see it) on a tr.nn layer after
    a traced function called it: the function traces again and gives what eager gives, where the
    old forward stayed compiled in, silently. Setting attributes the class does not define, and
    model.train()/eval(), change nothing of it."""
    model = nn.Sequential(nn.Linear(2, 2, dtype=tr.float64), nn.Tanh())
    traced = tr.trace(lambda x: model(x))
    x = tr.ones(1, 2, dtype=tr.float64)
    traced(x)
    model.note = "set on an instance, no class attribute"
    model.eval()
    model.train()
    traced(x)
    assert traced.cache_info().misses == 1
    if replaced == "first layer":
        model[0].forward = lambda input: input * 3.0
    else:
        model[1].forward = lambda input: input.sigmoid()
    np.testing.assert_allclose(traced(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-15)
    assert traced.cache_info().misses == 2


def test_pickled_modules_keep_non_persistent_buffers_and_older_pickles_get_empty_hooks():
    model = nn.Linear(3, 2, dtype=tr.float64)
    model.register_buffer("scale", tr.full((3,), 2.0), persistent=False)
    loaded = pickle.loads(pickle.dumps(model))
    assert list(loaded.state_dict()) == ["weight", "bias"]
    np.testing.assert_array_equal(loaded.scale.numpy(), [2.0, 2.0, 2.0])
    older = {name: value for name, value in vars(model).items()
             if not name.startswith("_forward") and name != "_non_persistent_buffers_set"}
    revived = nn.Linear.__new__(nn.Linear)
    revived.__setstate__(older)
    x = tr.tensor(rng.standard_normal((2, 3)))
    np.testing.assert_array_equal(_numpy(revived(x)), _numpy(model(x)))
    assert list(revived.state_dict()) == ["weight", "bias", "scale"]
