"""What a traced function reads besides its arguments, and arguments that share memory: the
compiled call gives eager mode's answer, or a clear error, never a stale or mixed-up one."""
import dataclasses
import random
import sys

import numpy as np
import pytest

import tracer as tr

W = tr.tensor([1.0, 2.0])
SCALE = 2.0


def scaled(x):
    return x * W * SCALE


def test_rebinding_a_global_tensor_or_number_traces_again():
    global W, SCALE
    f = tr.trace(scaled)
    np.testing.assert_array_equal(f(tr.tensor([1.0, 1.0])).numpy(), [2.0, 4.0])
    saved = W, SCALE
    try:
        W, SCALE = tr.tensor([10.0, 20.0]), 3.0
        np.testing.assert_array_equal(f(tr.tensor([1.0, 1.0])).numpy(), [30.0, 60.0])
        assert f.cache_info().misses == 2 and f.cache_info().size == 1
    finally:
        W, SCALE = saved


def test_closure_number_is_guarded():
    factor = 2.0
    f = tr.trace(lambda x: x * factor)
    assert f(tr.tensor([1.0])).item() == 2.0
    factor = 5.0  # noqa: F841 (read by the lambda)
    assert f(tr.tensor([1.0])).item() == 5.0


def test_argument_also_reached_through_a_global_name():
    def bump(x):
        x.add_(10)
        return W * 1

    original = W.numpy().copy()
    try:
        result = tr.trace(bump)(W)
        np.testing.assert_array_equal(result.numpy(), original + 10)
        np.testing.assert_array_equal(W.numpy(), original + 10)
    finally:
        W.numpy()[...] = original


def test_written_argument_sharing_memory_with_another_is_refused():
    buffer = np.arange(6, dtype=np.float32)

    def two(x, y):
        x.mul_(2)
        y.add_(1)
        return x + y

    with pytest.raises(tr.ArgumentError, match="shares memory"):
        tr.trace(two)(buffer[0:4], buffer[2:6])
    np.testing.assert_array_equal(buffer, np.arange(6, dtype=np.float32))


def test_read_only_tensor_argument_changes_nothing():
    writable = np.ones(3, np.float32)
    read_only = np.ones(3, np.float32)
    read_only.flags.writeable = False

    def update(x, y):
        x.add_(1)
        y.add_(1)
        return x + y

    with pytest.raises(tr.ArgumentError, match="read-only"):
        tr.trace(update)(tr.from_numpy(writable), tr.from_numpy(read_only))
    np.testing.assert_array_equal(writable, [1.0, 1.0, 1.0])


def test_numpy_argument_changed_before_backward_does_not_change_the_gradient():
    model = tr.trace(lambda x, w: (x * w).sum())
    w = tr.tensor([1.0, 1.0], requires_grad=True)
    x = np.array([1.0, 2.0], np.float32)
    y = model(x, w)
    x[:] = 100
    y.backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 2.0])


def test_static_arguments_of_different_types_are_different_signatures():
    f = tr.trace(lambda x, n: x * (2 if isinstance(n, int) else 3), static_argnums=-1)
    assert f(tr.tensor([1.0]), 2).item() == 2.0
    assert f(tr.tensor([1.0]), 2.0).item() == 3.0
    assert f.cache_info().misses == 2


# A loop's counter named like a method the step calls (`opt.step()`, `x.t()`): a global the
# function never reads, which guarding by value compiled again on every call.
step = 0
t = 0.5


def test_a_global_named_like_an_attribute_is_not_guarded():
    global step, t
    models = [tr.nn.Linear(3, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    optimizers = [tr.optim.SGD(model.parameters(), lr=0.1) for model in models]

    def train_step(model, opt, x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean() + (x.t() ** 2).sum() * 0
        loss.backward()
        opt.step()
        return loss

    traced = tr.trace(lambda x, y: train_step(models[0], optimizers[0], x, y))
    rng = np.random.default_rng(0)
    x, y = (tr.tensor(rng.standard_normal(shape).astype(np.float32)) for shape in ((4, 3), (4, 2)))
    saved = step, t
    try:
        for _ in range(5):
            loss = traced(x, y)
            expected = train_step(models[1], optimizers[1], x, y)  # eager: the oracle
            np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-6)
            step, t = step + 1, t + 1.0
    finally:
        step, t = saved
    assert traced.cache_info().misses == 1
    for mine, theirs in zip(models[0].parameters(), models[1].parameters()):
        np.testing.assert_allclose(mine.detach().numpy(), theirs.detach().numpy(), rtol=1e-6)


OFFSET = 1


def test_a_global_read_in_nested_code_is_still_guarded():
    global OFFSET
    f = tr.trace(lambda x: sum((lambda: [x * OFFSET for _ in range(2)])()))
    saved = OFFSET
    try:
        for offset in (1, 3):
            OFFSET = offset
            np.testing.assert_array_equal(f(tr.tensor([1.0, 2.0])).numpy(),
                                          2 * offset * np.array([1.0, 2.0]))
    finally:
        OFFSET = saved
    assert f.cache_info().misses == 2


class Counting(tr.nn.Module):
    """A module whose `step` and `count` the training loop counts up, and whose `scale` its
    forward reads."""

    def __init__(self):
        super().__init__()
        self.layer = tr.nn.Linear(3, 1)
        self.step, self.count, self.scale = 0, 0, 2

    def forward(self, x):
        return self.layer(x) * self.scale


def test_an_attribute_named_like_a_method_called_is_not_guarded():
    model = Counting()
    opt = tr.optim.SGD(model.parameters(), lr=0.1)

    @tr.trace
    def train_step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    x = tr.tensor(np.ones((2, 3), np.float32))
    for _ in range(4):
        weight, bias = model.layer.weight.detach().numpy().copy(), model.layer.bias.item()
        expected = 2 * (weight.sum(axis=1) + bias) * 2  # two rows of ones, scale 2
        np.testing.assert_allclose(train_step(x).item(), expected.item(), rtol=1e-6)
        model.step += 1
        model.count += 1
    assert train_step.cache_info().misses == 1
    model.scale = 3  # read by forward: traced again, with the new value
    weight, bias = model.layer.weight.detach().numpy().copy(), model.layer.bias.item()
    np.testing.assert_allclose(train_step(x).item(), (2 * (weight.sum(axis=1) + bias) * 3).item(),
                               rtol=1e-6)
    assert train_step.cache_info().misses == 2


def test_the_native_profile_hook_records_the_code_the_python_one_does(monkeypatch):
    from tracer.runtime import code_names, profile_hook
    assert profile_hook._address() is not None  # (compiled now if the disk cache lacks it)
    model = tr.nn.Sequential(tr.nn.Linear(3, 4), tr.nn.GELU(), tr.nn.Linear(4, 1))

    def run():
        return (model(tr.ones(2, 3)) * SCALE).sum()

    run()  # (imports what it needs first)
    recorded, installed = [], []
    install = profile_hook.install
    monkeypatch.setattr(code_names, "NATIVE_AFTER", 3)  # native from the third call on
    for native in (True, False):
        monkeypatch.setattr(profile_hook, "install", lambda codes, native=native: installed.append(
            native) or (native and install(codes)))
        with code_names.recording_names() as used:
            run()
        recorded.append((set(used), set(used.codes)))
    assert installed[0] and not installed[-1]  # (a collection meanwhile installs the hook again)
    assert recorded[0] == recorded[1] and len(recorded[0][1]) > 20
    assert run.__code__ in recorded[0][1] and {"SCALE", "weight"} <= recorded[0][0]


FINALIZER_ONLY = 1


def _finalizer_reads() -> int:
    return FINALIZER_ONLY


class _CyclicGarbage:
    """Garbage only the cyclic collector frees; its finalizer runs Python code, as that of many
    objects of the libraries a traced function uses does."""

    def __init__(self, ran: list):
        self.itself, self.ran = self, ran

    def __del__(self):
        self.ran.append(_finalizer_reads())


@pytest.mark.parametrize("native", [True, False], ids=["native hook", "python hook"])
def test_what_a_collection_runs_while_a_function_is_traced_is_not_recorded(monkeypatch, native):
    """Finalizers run wherever a collection starts: their code is not the traced function's, and
    the names it reads are not guarded (else which are depends on when collections come)."""
    import gc
    from tracer.runtime import code_names, profile_hook
    install = profile_hook.install
    monkeypatch.setattr(code_names, "NATIVE_AFTER", 1)  # native from the first call on, or not
    monkeypatch.setattr(profile_hook, "install", lambda codes: native and install(codes))
    ran, thresholds, callbacks = [], gc.get_threshold(), list(gc.callbacks)
    gc.disable()
    try:
        _CyclicGarbage(ran)  # (young until the next collection: the collector is off)
        gc.set_threshold(1, 10**6, 10**6)  # each allocation collects the youngest generation
        with code_names.recording_names() as used:
            gc.enable()
            result = scaled(tr.tensor([1.0, 1.0]))
            ran_inside, recording = list(ran), sys.getprofile()
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()
    np.testing.assert_array_equal(result.numpy(), [2.0, 4.0])
    assert ran_inside == [1]  # the finalizer ran while recording, and the recording went on:
    assert (recording is used.codes) == native  # (the native hook's object is the set it fills)
    assert sys.getprofile() is None and gc.callbacks == callbacks
    assert scaled.__code__ in used.codes and {"SCALE", "W"} <= used
    assert _finalizer_reads.__code__ not in used.codes and "FINALIZER_ONLY" not in used
    assert _CyclicGarbage.__del__.__code__ not in used.codes


def test_a_profile_hook_that_cannot_be_linked_leaves_the_recording_in_python(monkeypatch):
    from tracer.runtime import code_names, profile_hook
    monkeypatch.setattr(profile_hook, "_hook", [])
    monkeypatch.setattr(profile_hook, "_unavailable", [])
    monkeypatch.setattr(profile_hook, "_linked", lambda compile_it=True: 1 / 0)
    monkeypatch.setattr(code_names, "NATIVE_AFTER", 3)
    with code_names.recording_names() as used:
        result = scaled(tr.tensor([1.0, 1.0]))
    np.testing.assert_array_equal(result.numpy(), [2.0, 4.0])
    assert scaled.__code__ in used.codes and "SCALE" in used  # recorded on, in Python
    assert isinstance(profile_hook._unavailable[0], ZeroDivisionError)


def test_a_trace_records_with_the_native_hook_from_its_first_call_when_it_is_at_hand():
    from tracer.runtime import code_names, profile_hook
    assert profile_hook._address() is not None  # linked (compiled now if the disk cache lacks it)
    assert profile_hook.at_hand()
    with code_names.recording_names() as used:
        recording = sys.getprofile()
        result = scaled(tr.tensor([1.0, 1.0]))
    assert recording is used.codes  # the native hook's object is the set it fills
    np.testing.assert_array_equal(result.numpy(), [2.0, 4.0])
    assert scaled.__code__ in used.codes and {"SCALE", "W"} <= used


def test_a_compiled_program_leaves_the_profile_hook_in_the_disk_cache(tmp_path, monkeypatch):
    """For the processes after: their traces find it at hand, without compiling it."""
    from tracer.runtime import pipeline, profile_hook
    monkeypatch.setenv("TRACER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACER_DISABLE_CACHE", raising=False)
    monkeypatch.setattr(pipeline, "_compiled", {})
    monkeypatch.setattr(profile_hook, "_hook", [])  # (as in a fresh process)
    monkeypatch.setattr(profile_hook, "_unavailable", [])
    assert not profile_hook.at_hand() and not list(tmp_path.glob("*.hook"))
    with tr.no_grad():  # (a short trace: recorded in Python)
        result = tr.trace(lambda x: x * 3.25 + 1)(tr.ones(3))
    np.testing.assert_array_equal(result.numpy(), [4.25, 4.25, 4.25])
    assert len(list(tmp_path.glob("*.hook"))) == 1
    monkeypatch.setattr(profile_hook, "_hook", [])
    assert profile_hook.at_hand()  # linked from the disk cache


def test_the_global_names_read_off_the_bytecode_are_those_dis_names():
    import argparse
    import dis
    import json
    import types
    from tracer.runtime import code_names

    def by_dis(code: types.CodeType) -> frozenset[str]:
        names = {instruction.argval for instruction in dis.get_instructions(code)
                 if instruction.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL",
                                           "LOAD_NAME", "STORE_NAME", "DELETE_NAME")}
        return frozenset(names.union(*(by_dis(c) for c in code.co_consts
                                       if isinstance(c, types.CodeType))))

    # a function naming 300 globals (indices past 255 take an EXTENDED_ARG), and a module body
    # with a class (LOAD_NAME, STORE_NAME)
    many = compile("def f():\n    return [" + ", ".join(f"g{i}" for i in range(300)) + "]\n"
                   "global h\nh = 1\nclass C:\n    x = len\n    del x\n", "<test>", "exec")
    # the functions and methods of tracer's modules, json's and argparse's
    modules = [m for name, m in sys.modules.items() if name.startswith(("tracer", "json", "argparse"))]
    members = [v for m in modules for v in vars(m).values()]
    members += [v for cls in members if isinstance(cls, type) for v in vars(cls).values()]
    codes = [many, *{id(f.__code__): f.__code__ for f in members
                     if isinstance(f, types.FunctionType)}.values()]
    assert len(codes) > 1000 and argparse and json
    assert {"g0", "g299", "h", "len", "x", "C"} <= code_names.global_names(many)
    for code in codes:
        assert code_names.global_names(code) == by_dis(code), code


class Options(dict):
    """A configuration read as attributes (`options.scale`) that are its items."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Holder:
    def __init__(self, scale: int):
        self.scale = scale


@dataclasses.dataclass
class Settings:
    scale: int = 2


def option(holder, name: str):
    """Reads an attribute by a name its caller gives (as dataclasses.asdict, a config helper)."""
    return getattr(holder, name)


def test_an_attribute_read_by_a_name_another_code_holds_is_guarded():
    # An item read as an attribute through __getattr__, an attribute read by getattr in a helper
    # or in dataclasses.asdict with the name its caller holds: each was guarded (before 66ba58e),
    # then compiled stale after a change (the old scale 2 with the new 3).
    options, holder, settings = Options(scale=2), Holder(2), Settings()
    traced = [tr.trace(lambda x: x * options.scale), tr.trace(lambda x: x * option(holder, "scale")),
              tr.trace(lambda x: x * dataclasses.asdict(settings)["scale"])]
    x = tr.tensor([1.0, 2.0])
    for f in traced:
        np.testing.assert_array_equal(f(x).numpy(), [2.0, 4.0])
    options["scale"], holder.scale, settings.scale = 3, 3, 3
    for f in traced:
        np.testing.assert_array_equal(f(x).numpy(), [3.0, 6.0])
        assert f.cache_info().misses == 2


class Augment(random.Random):
    """A user's generator that also holds a setting the step reads."""

    def __init__(self):
        super().__init__(0)
        self.scale = 2


def test_a_setting_held_by_a_users_generator_is_guarded():
    # The walk keeps a generator to see its draws (runtime/random_draws.py); since 9a40c37 it did
    # not look into it further, so a change of a subclass's own attribute was compiled stale.
    augment = Augment()
    f = tr.trace(lambda x: x * augment.scale)
    np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [2.0, 2.0])
    augment.scale = 3
    np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [3.0, 3.0])
    assert f.cache_info().misses == 2


def test_a_setting_in_a_users_module_is_guarded_or_a_runtime_input(tmp_path, monkeypatch):
    (tmp_path / "user_settings.py").write_text("scale = 2\nfactor = 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_settings
    try:
        f = tr.trace(lambda x: x * user_settings.scale * user_settings.factor)
        np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [1.0, 1.0])
        user_settings.factor = 0.25  # a float: a runtime input, no new trace
        np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [0.5, 0.5])
        assert f.cache_info().misses == 1
        user_settings.scale = 3  # an int: compiled in, traced again (before: 2, stale)
        np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [0.75, 0.75])
        assert f.cache_info().misses == 2
    finally:
        sys.modules.pop("user_settings", None)


@pytest.mark.parametrize("settings", ["SimpleNamespace", "argparse.Namespace"])
def test_a_setting_in_a_namespace_is_guarded_or_a_runtime_input(settings):
    import argparse
    import types
    kind = types.SimpleNamespace if settings == "SimpleNamespace" else argparse.Namespace
    options = kind(scale=2, lr=0.5)
    f = tr.trace(lambda x: x * options.scale * options.lr)
    np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [1.0, 1.0])
    options.lr = 0.25  # a float: a runtime input, no new trace (before: compiled in, stale)
    np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [0.5, 0.5])
    assert f.cache_info().misses == 1
    options.scale = 3  # an int: traced again (before: 2, stale)
    np.testing.assert_array_equal(f(tr.ones(2)).numpy(), [0.75, 0.75])
    assert f.cache_info().misses == 2


class _Config:
    scale = 2.0


class _Scaled(tr.nn.Module):
    shift = 1.0

    def forward(self, x):
        return x * _Config.scale + self.shift


def test_floats_in_a_class_body_are_read_on_every_call():
    """A float a class holds (`Config.scale`, found by the class's name; `self.shift`, through
    an instance) is a runtime input: changing it after the first call gives the new value, as
    eagerly, with no new trace (found by review: both were baked in, silently)."""
    model = _Scaled()
    compiled = tr.trace(model)
    x = tr.tensor([1.0, 2.0], dtype=tr.float64)
    try:
        np.testing.assert_array_equal(compiled(x).numpy(), [3.0, 5.0])
        _Config.scale = 3.0
        np.testing.assert_array_equal(compiled(x).numpy(), [4.0, 7.0])
        _Scaled.shift = -1.0
        np.testing.assert_array_equal(compiled(x).numpy(), [2.0, 5.0])
        assert compiled.cache_info().misses == 1
    finally:
        _Config.scale, _Scaled.shift = 2.0, 1.0


class _Shape:
    repeats = 2
    mode = "sum"
    axes = (0,)


class _Repeated(tr.nn.Module):
    offset = 1

    def forward(self, x):
        y = x.repeat(1, _Shape.repeats) + self.offset
        return y.sum(_Shape.axes) if _Shape.mode == "sum" else y.amax(_Shape.axes)


@pytest.mark.parametrize("change", ["int by class name", "int through self", "string", "tuple"])
def test_ints_strings_and_tuples_in_a_class_body_trace_again_when_changed(change):
    """An int, a string or a tuple a class holds shapes the code: compiled in and guarded, so
    changing it traces again and gives eager's value (they were compiled in unguarded: silently
    the old result)."""
    model = _Repeated()
    compiled = tr.trace(model)
    x = tr.tensor([[1.0, 2.0], [3.0, -4.0]], dtype=tr.float64)
    saved = (_Shape.repeats, _Shape.mode, _Shape.axes, _Repeated.offset)
    try:
        np.testing.assert_array_equal(compiled(x).numpy(), model(x).numpy())
        if change == "int by class name":
            _Shape.repeats = 3
        elif change == "int through self":
            _Repeated.offset = 5
        elif change == "string":
            _Shape.mode = "max"
        else:
            _Shape.axes = (1,)
        expected = model(x).numpy()
        # hand-computed: the eager composition of numpy's own operations
        repeated = np.tile(x.numpy(), (1, _Shape.repeats)) + _Repeated.offset
        np.testing.assert_array_equal(
            expected, repeated.sum(_Shape.axes) if _Shape.mode == "sum" else repeated.max(_Shape.axes))
        np.testing.assert_array_equal(compiled(x).numpy(), expected)
        assert compiled.cache_info().misses == 2
    finally:
        _Shape.repeats, _Shape.mode, _Shape.axes, _Repeated.offset = saved


def test_an_int_of_a_submodule_reached_through_its_attribute_is_guarded():
    """`self.block.width`: the path runs through the module's registry (`_modules`), which its
    __getattr__ reads by a name in a tuple, so the walk's requirement that the code name every
    step dropped the guard, and a changed width silently kept the traced one (measured: the
    compiled model returned 2 columns where eager returned 3)."""
    class Block(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.width = 2

        def forward(self, x):
            return x[:, :self.width] * 2

    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x) + 1

    model = Model()
    compiled = tr.trace(model)
    x = tr.tensor(np.arange(8.0).reshape(2, 4))
    np.testing.assert_array_equal(compiled(x).numpy(), model(x).numpy())
    model.block.width = 3
    np.testing.assert_array_equal(compiled(x).numpy(), x.numpy()[:, :3] * 2 + 1)
    assert compiled.cache_info().misses == 2


def test_replacing_a_layer_without_tensors_or_a_function_traces_again():
    """A module or function the model calls, replaced after the first call: nothing on its path
    is a tensor or a number, so nothing was guarded and the compiled model silently kept the old
    one (measured: ReLU kept after `model.activation = nn.Tanh()`, 0.15 off eager; F.relu kept
    after `model.gate = F.silu`, 0.32 off; in a Sequential, `model[1] = nn.Tanh()`, 0.24 off).
    The class of each object on a path and each function are guarded, as torch.compile guards
    them."""
    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = tr.nn.Linear(4, 4, dtype=tr.float64)
            self.activation = tr.nn.ReLU()
            self.gate = tr.nn.functional.relu

        def forward(self, x):
            return self.gate(self.activation(self.linear(x)) - 0.3)

    tr.manual_seed(0)
    model = Model()
    sequential = tr.nn.Sequential(tr.nn.Linear(4, 4, dtype=tr.float64), tr.nn.ReLU())
    compiled, compiled_sequential = tr.trace(model), tr.trace(sequential)
    x = tr.tensor(np.random.default_rng(0).standard_normal((3, 4)))
    compiled(x), compiled_sequential(x)
    for change in (lambda: setattr(model, "activation", tr.nn.Tanh()),
                   lambda: setattr(model, "activation", tr.nn.GELU()),
                   lambda: setattr(model, "gate", tr.nn.functional.silu),
                   lambda: sequential.__setitem__(1, tr.nn.Tanh())):
        change()
        for traced, module in ((compiled, model), (compiled_sequential, sequential)):
            # (the compiled tanh and exp are a few ulp from numpy's)
            np.testing.assert_allclose(traced(x).detach().numpy(), module(x).detach().numpy(),
                                       rtol=1e-14, atol=1e-15)
    assert compiled.cache_info().misses == 4


def test_an_enum_setting_is_guarded():
    """`if self.reduction is Reduction.SUM:` on a module's Enum attribute: the member was walked
    into as an object (its `_value_`, which the code does not name) and nothing was guarded, so
    changing it kept the traced branch (measured: the compiled block still returned the mean)."""
    import enum

    class Reduction(enum.Enum):
        MEAN = "mean"
        SUM = "sum"

    class Pool(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.reduction = Reduction.MEAN

        def forward(self, x):
            return x.sum(1) if self.reduction is Reduction.SUM else x.mean(1)

    pool = Pool()
    compiled = tr.trace(pool)
    x = tr.tensor([[1.0, 2.0, 6.0]])
    assert compiled(x).item() == 3.0
    pool.reduction = Reduction.SUM
    assert compiled(x).item() == 9.0


def test_a_set_or_range_setting_changed_traces_again():
    """`if index in self.skipped:` and `for _ in self.repeats:`: sets and ranges were neither
    walked nor guarded, so adding a layer to skip, or another repeat, kept the traced loop
    (measured: the compiled model returned the old values)."""
    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.skipped, self.frozen, self.repeats = {1}, frozenset({0}), range(2)

        def forward(self, x):
            for index in range(3):
                if index not in self.skipped:
                    x = x * 3 if index in self.frozen else x + 1
            for _ in self.repeats:
                x = x * 2
            return x

    model = Model()
    compiled = tr.trace(model)
    x = tr.tensor([1.0, 2.0])
    np.testing.assert_array_equal(compiled(x).numpy(), model(x).numpy())
    for change in (lambda: model.skipped.add(2), lambda: model.skipped.discard(1),
                   lambda: setattr(model, "frozen", frozenset({1})),
                   lambda: setattr(model, "repeats", range(3))):
        change()
        np.testing.assert_array_equal(compiled(x).numpy(), model(x).numpy())
    assert compiled.cache_info().misses == 5


def test_settings_in_an_object_with_slots_are_guarded():
    """A `dataclass(slots=True)` config has no __dict__: the walk did not look into it, so its
    ints and strings were not guarded and a changed one kept the traced code (measured: the
    compiled model kept 2 elements and relu after the config said 3 and tanh)."""
    @dataclasses.dataclass(slots=True)
    class Settings:
        width: int = 2
        activation: str = "relu"

    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.settings = Settings()

        def forward(self, x):
            y = x[:self.settings.width] * 2
            return y.relu() if self.settings.activation == "relu" else y.tanh()

    model = Model()
    compiled = tr.trace(model)
    x = tr.tensor([-1.0, 2.0, -3.0, 4.0], dtype=tr.float64)
    np.testing.assert_array_equal(compiled(x).numpy(), [0.0, 4.0])
    model.settings.width = 3
    np.testing.assert_array_equal(compiled(x).numpy(), [0.0, 4.0, 0.0])
    model.settings.activation = "tanh"
    np.testing.assert_allclose(compiled(x).numpy(), np.tanh([-2.0, 4.0, -6.0]), rtol=1e-14)


def test_a_container_the_model_iterates_grown_or_shrunk_traces_again(monkeypatch):
    """`for block in self.blocks:` over a ModuleList, a list, a dict or a Sequential: only the
    items' paths were guarded, so an item added (or a dict key removed) after the first call
    kept the traced loop (measured: every one of these changes returned the old result)."""
    class Model(tr.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = tr.nn.ModuleList([tr.nn.Linear(3, 3, dtype=tr.float64)])
            self.scales = [1.0]
            self.offsets = {"first": 1}
            self.tail = tr.nn.Sequential(tr.nn.Tanh())

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            for scale in self.scales:
                x = x * scale
            for offset in self.offsets.values():
                x = x + offset
            return self.tail(x)

    monkeypatch.setenv("TRACER_RECOMPILE_WARNING", "10")  # (each change is meant to recompile)
    tr.manual_seed(0)
    model = Model()
    compiled = tr.trace(model)
    x = tr.tensor(np.ones((2, 3)))
    changes = (lambda: model.blocks.append(tr.nn.Linear(3, 3, dtype=tr.float64)),
               lambda: model.scales.append(3.0), lambda: model.offsets.__setitem__("second", 4),
               lambda: model.tail.append(tr.nn.ReLU()), lambda: model.offsets.pop("first"),
               lambda: model.scales.pop(0))
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(),
                               rtol=1e-14)
    for change in changes:
        change()
        # (the compiled tanh is a few ulp from numpy's)
        np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(),
                                   rtol=1e-14)
    assert compiled.cache_info().misses == 1 + len(changes)


def test_a_list_the_function_appends_to_while_tracing_does_not_trace_again():
    """A log the function itself appends to grows while tracing only (as other Python state it
    changes); guarding its length would trace again on every call."""
    log = []
    scales = [2.0]

    @tr.trace
    def scaled(x):
        log.append("traced")
        for scale in scales:
            x = x * scale
        return x

    for _ in range(3):
        np.testing.assert_array_equal(scaled(tr.tensor([1.0])).numpy(), [2.0])
    assert scaled.cache_info().misses == 1 and log == ["traced"]
    scales.append(3.0)  # (a list it only reads: guarded)
    np.testing.assert_array_equal(scaled(tr.tensor([1.0])).numpy(), [6.0])


class _Tempered(tr.nn.Module):
    def forward(self, x):
        return x * getattr(self, "temperature", 1.0) + (1.0 if hasattr(self, "shift") else 0.0)


class _Cubed:
    def __call__(self, x):
        return x ** 3 if "cube" in vars(self) else x


class _Switched:
    def __call__(self, x):
        for name in ("halve",):  # (a name held in a tuple)
            if hasattr(self, name):
                x = x / 2
        return x * 2 if hasattr(self, "double") else x - getattr(self, "offset", 0)


@pytest.mark.parametrize("change", ["float by getattr", "hasattr", "parameter by getattr",
                                    "plain object", "int by getattr", "name in a tuple", "in vars",
                                    "user module", "class by name"])
def test_an_attribute_absent_when_traced_and_set_later_traces_again(change, tmp_path,
                                                                    monkeypatch):
    """`getattr(obj, "name", default)` and `hasattr(obj, "name")` on an attribute absent when
    traced: setting it later gives eager's result, not the default compiled in (before: silently
    the old result)."""
    (tmp_path / "late_settings.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    import late_settings

    class Late:
        pass

    model, switched, cubed = _Tempered(), _Switched(), _Cubed()
    functions = {"float by getattr": model, "hasattr": model, "parameter by getattr": model,
                 "plain object": switched, "int by getattr": switched, "name in a tuple": switched,
                 "in vars": cubed,
                 "user module": lambda x: x * getattr(late_settings, "scale", 1),
                 "class by name": lambda x: x * getattr(Late, "scale", 1.0)}
    function = functions[change]
    compiled = tr.trace(function)
    x = tr.tensor([1.0, -2.0], dtype=tr.float64)
    try:
        np.testing.assert_array_equal(compiled(x).numpy(), function(x).numpy())
        if change == "float by getattr":
            model.temperature = 0.5
        elif change == "hasattr":
            model.shift = None
        elif change == "parameter by getattr":
            model.temperature = tr.nn.Parameter(tr.tensor([3.0, 4.0], dtype=tr.float64))
        elif change == "plain object":
            switched.double = True
        elif change == "int by getattr":
            switched.offset = 3
        elif change == "name in a tuple":
            switched.halve = True
        elif change == "in vars":
            cubed.cube = True
        elif change == "user module":
            late_settings.scale = 3
        else:
            Late.scale = 0.25
        expected = function(x).detach().numpy()
        assert not np.array_equal(expected, x.numpy())  # (the change changes eager's result)
        np.testing.assert_array_equal(compiled(x).detach().numpy(), expected)
    finally:
        sys.modules.pop("late_settings", None)


class _Block(tr.nn.Module):
    scale = 2
    factor = 0.5

    def act(self, x):
        return x.relu()

    def forward(self, x):
        return self.act(x) * self.scale * self.factor


def _negate(x):
    return -x


@pytest.mark.parametrize("change", ["int", "float", "method", "forward"])
def test_an_instance_attribute_shadowing_its_class_s_set_later_is_seen(change):
    """`block.scale = 3` where the class body holds `scale = 2` (or a float, or a method
    `act`, or Module's forward): eagerly the instance's attribute wins from then on; compiled, it
    traces again (or reads the new float as a runtime input). Before: the class's value, guarded
    at the class, silently stayed."""
    block = _Block()
    compiled = tr.trace(block)
    x = tr.tensor([1.0, -2.0], dtype=tr.float64)
    np.testing.assert_array_equal(compiled(x).numpy(), block(x).numpy())
    if change == "int":
        block.scale = 3
    elif change == "float":
        block.factor = 0.25
    elif change == "method":
        block.act = _negate
    else:
        block.forward = _negate
    expected = block(x).numpy()
    np.testing.assert_array_equal(expected, {"int": [1.5, 0.0], "float": [0.5, 0.0],
                                             "method": [-1.0, 2.0], "forward": [-1.0, 2.0]}[change])
    np.testing.assert_array_equal(compiled(x).numpy(), expected)
    if change == "float":  # a float set on the instance: read as a runtime input from then on
        block.factor = 0.125
        np.testing.assert_array_equal(compiled(x).numpy(), [0.25, 0.0])
        assert compiled.cache_info().misses == 2
