"""A name a traced function read where it was absent (`getattr(layer, "scale", 1.0)`, `hasattr`,
`try: self.temperature` / `except AttributeError`, an unset `__slots__` slot), on the user's own
objects and on tracer's (tr.nn layers, optimizers, schedulers), then set: the compiled call gives
eager mode's (and PyTorch's) result, not the default compiled in. And a step that reads no such
name gets no guard for one."""
import contextlib
import dataclasses
import functools
import sys

import numpy as np
import pytest
import torch

import tracer as tr
from tracer import nn


class _Scaled(nn.Module):
    """A user's model whose forward asks its tr.nn layer (or the optimizer beside it) for a name
    that layer lacks, each in its own way."""

    def __init__(self, way: str, optimizer_holder: list):
        super().__init__()
        self.linear = nn.Linear(2, 2).double()
        self.way, self.optimizer_holder = way, optimizer_holder

    def scale(self):
        linear = self.linear
        if self.way == "getattr":
            return getattr(linear, "scale", 1.0)
        if self.way == "hasattr":
            return 2.0 if hasattr(linear, "doubled") else 1.0
        if self.way == "try":
            try:
                return linear.temperature
            except AttributeError:
                return 1.0
        if self.way == "try on itself":
            try:
                return self.temperature
            except AttributeError:
                return 1.0
        if self.way == "built name":
            return getattr(linear, "scale_" + self.way.split()[0], 1.0)
        if self.way == "optimizer getattr":
            return getattr(self.optimizer_holder[0], "scale", 1.0)
        if self.way == "optimizer hasattr":
            return 2.0 if hasattr(self.optimizer_holder[0], "doubled") else 1.0
        if self.way == "param group":
            return self.optimizer_holder[0].param_groups[0].get("scale", 1.0)
        return getattr(self.optimizer_holder[1], "scale", 1.0)  # a scheduler

    def forward(self, x):
        return self.linear(x) * self.scale()


def _set(model: _Scaled, way: str, value: float) -> None:
    """The change the user makes between calls, by the name `way` reads."""
    optimizer, scheduler = model.optimizer_holder
    if way in ("getattr", "built name"):
        setattr(model.linear, "scale" if way == "getattr" else "scale_built", value)
    elif way == "hasattr":
        model.linear.doubled = True
    elif way == "try":
        model.linear.temperature = value
    elif way == "try on itself":
        model.temperature = value
    elif way == "optimizer getattr":
        optimizer.scale = value
    elif way == "optimizer hasattr":
        optimizer.doubled = True
    elif way == "param group":
        optimizer.param_groups[0]["scale"] = value
    else:
        scheduler.scale = value


WEIGHT, BIAS = np.array([[0.5, -1.0], [1.5, 0.25]]), np.array([0.1, -0.2])
X, Y = np.array([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.7]]), np.array([[0.5, 0.0], [1.0, -1.0],
                                                                   [0.0, 0.2]])


def _torch_steps(scales: list[float]) -> list[tuple]:
    """(loss, weight, bias) after each SGD step of the same model in PyTorch, whose forward
    multiplies by scales[k] at step k (the oracle)."""
    linear = torch.nn.Linear(2, 2).double()
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(WEIGHT))
        linear.bias.copy_(torch.tensor(BIAS))
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    results = []
    for scale in scales:
        optimizer.zero_grad()
        loss = ((linear(torch.tensor(X)) * scale - torch.tensor(Y)) ** 2).mean()
        loss.backward()
        optimizer.step()
        results.append((loss.item(), linear.weight.detach().numpy().copy(),
                        linear.bias.detach().numpy().copy()))
    return results


@pytest.mark.parametrize("way", ["getattr", "hasattr", "try", "try on itself", "built name",
                                 "optimizer getattr", "optimizer hasattr", "param group",
                                 "scheduler"])
def test_a_name_absent_from_tracers_own_objects_and_set_later_traces_again(way):
    """A training step whose forward reads a name its tr.nn layer (or its own tr.nn Module, the
    optimizer, a scheduler) lacks, and falls back to 1; the user sets the name (2.0) after two
    compiled steps: the third step uses it, as eagerly and in PyTorch. Before: tracer's own
    objects got no absence guard (for cost) and the compiled step kept multiplying by 1.0,
    silently (but the param group, a dict: its keys were guarded already)."""
    holder: list = []
    model = _Scaled(way, holder)
    model.linear.weight.data.copy_(tr.tensor(WEIGHT))
    model.linear.bias.data.copy_(tr.tensor(BIAS))
    optimizer = tr.optim.SGD(model.parameters(), lr=0.1)
    holder += [optimizer, tr.optim.lr_scheduler.StepLR(optimizer, 100)]

    @tr.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss

    expected = _torch_steps([1.0, 1.0, 2.0, 2.0])
    x, y = tr.tensor(X), tr.tensor(Y)
    for number, (loss, weight, bias) in enumerate(expected):
        if number == 2:
            _set(model, way, 2.0)
        np.testing.assert_allclose(step(x, y).item(), loss, rtol=1e-12)
        np.testing.assert_allclose(model.linear.weight.detach().numpy(), weight, rtol=1e-12)
        np.testing.assert_allclose(model.linear.bias.detach().numpy(), bias, rtol=1e-12)
    assert step.cache_info().misses == 2  # traced again once, at the change


class _User:
    """A user's object reading a name it may lack in each way Python allows."""

    def __init__(self, way: str):
        self.way = way

    def __call__(self, x):
        if self.way == "except AttributeError":
            try:
                scale = self.temperature
            except AttributeError:
                scale = 1.0
        elif self.way == "except Exception":
            try:
                scale = self.temperature
            except Exception:
                scale = 1.0
        elif self.way == "bare except":
            try:
                scale = self.temperature
            except:  # noqa: E722 - the form under test
                scale = 1.0
        else:
            scale = 1.0
            with contextlib.suppress(AttributeError):
                scale = self.temperature
        return x * scale


class _Slotted:
    __slots__ = ("scale", "shift")

    def __call__(self, x):
        return x * getattr(self, "scale", 1.0) + (1.0 if hasattr(self, "shift") else 0.0)


@dataclasses.dataclass(slots=True)
class _SlottedSettings:
    depth: int = 1
    scale: float = dataclasses.field(default=None)


@pytest.mark.parametrize("way", ["except AttributeError", "except Exception", "bare except",
                                 "suppress", "slot by getattr", "slot by hasattr",
                                 "slot int by getattr", "dataclass slot deleted"])
def test_a_name_read_where_absent_on_a_users_object_and_set_later_traces_again(way):
    """`try: t = self.temperature` / `except AttributeError: t = 1.0` (or any handler that
    catches it), and an unset `__slots__` slot read by getattr with a default or hasattr: after
    the name is set, the compiled call gives eager's result. Before: the default, silently (the
    guards knew only names read by a string, on objects with a __dict__)."""
    x = tr.tensor([1.0, -2.0], dtype=tr.float64)
    if way.startswith("slot"):
        function = _Slotted()
    elif way == "dataclass slot deleted":
        settings = _SlottedSettings()
        del settings.depth

        def function(x):
            return x * getattr(settings, "depth", 1)
    else:
        function = _User(way)
    compiled = tr.trace(function)
    np.testing.assert_array_equal(compiled(x).numpy(), [1.0, -2.0])
    if way in ("slot by getattr",):
        function.scale = 2.0
    elif way == "slot by hasattr":
        function.shift = None
    elif way == "slot int by getattr":
        function.scale = 3
    elif way == "dataclass slot deleted":
        settings.depth = 3
    else:
        function.temperature = 2.0
    expected = {"slot by hasattr": [2.0, -1.0], "slot int by getattr": [3.0, -6.0],
                "dataclass slot deleted": [3.0, -6.0]}.get(way, [2.0, -4.0])
    np.testing.assert_array_equal(function(x).numpy(), expected)
    np.testing.assert_array_equal(compiled(x).numpy(), expected)
    assert compiled.cache_info().misses == 2


def _absence_guards(traced) -> list[str]:
    return [name for entry in traced._signatures.entries.values()
            for name, _, steps, _ in entry.guards if steps[-1][0] == "absent"]


def test_a_step_that_reads_no_absent_name_gets_no_absence_guard():
    """Tracer's own code asks its layers and optimizers nothing they lack (a guard each would
    cost every call): a step over many layer kinds, Adam, clipping and a scheduler, traced, has no
    absence guard. (Before the frozen standard library counted as the user's code: the first
    trace of a process that imported a module while tracing guarded ~70 names of posixpath and
    importlib on every user object.)"""
    tr.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 8), nn.LayerNorm(8),
                          nn.Dropout(0.1), nn.GELU(), nn.Linear(8, 3))
    encoder = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    recurrent, embedding = nn.LSTM(8, 8, batch_first=True), nn.Embedding(10, 8)
    parameters = [*model.parameters(), *encoder.parameters(), *recurrent.parameters(),
                  *embedding.parameters()]
    optimizer = tr.optim.Adam(parameters, lr=0.01)
    scheduler = tr.optim.lr_scheduler.StepLR(optimizer, 2)
    loss_function = nn.CrossEntropyLoss()

    @tr.trace
    def step(image, tokens, target):
        optimizer.zero_grad()
        sequence, _ = recurrent(encoder(embedding(tokens)))
        loss = loss_function(model(image) + sequence.mean(1)[:, :3], target)
        loss.backward()
        nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        return loss

    image, target = tr.randn(2, 2, 4, 4), tr.tensor(np.array([0, 2]))
    tokens = tr.tensor(np.array([[1, 2, 3], [4, 5, 6]]))
    for _ in range(3):
        step(image, tokens, target)
        scheduler.step()
    assert step.cache_info().misses == 1
    assert _absence_guards(step) == []


class _ByString(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2).double()
        self.linear.weight.data.copy_(tr.tensor(WEIGHT))
        self.linear.bias.data.copy_(tr.tensor(BIAS))

    def forward(self, x):
        for name in ("linear",):  # (layers by name, as models with numbered blocks do)
            x = getattr(self, name)(x)
        return x * getattr(self, "temperature", 1.0)


def test_a_submodule_read_by_a_string_is_present_and_compiles_once():
    """`getattr(self, name)` where the name "linear" is a registered submodule (in the Module's
    _modules, not its __dict__): present, so not guarded absent. Before: guarded so, failing on
    every call, each call traced again (3 calls, 3 compiles)."""
    model = _ByString()
    compiled = tr.trace(model)
    expected = X @ WEIGHT.T + BIAS
    for _ in range(3):
        np.testing.assert_allclose(compiled(tr.tensor(X)).detach().numpy(), expected,
                                   rtol=1e-12)
    assert compiled.cache_info().misses == 1
    model.temperature = 0.5  # (the absent one still is guarded)
    np.testing.assert_allclose(compiled(tr.tensor(X)).detach().numpy(), expected * 0.5,
                               rtol=1e-12)


class _Importing:
    def __call__(self, x):
        import imported_while_tracing
        return x * imported_while_tracing.FACTOR


def test_a_module_imported_while_tracing_adds_no_absence_guard(tmp_path, monkeypatch):
    """The standard library's frozen modules (importlib's bootstrap, posixpath: filenames
    "<frozen ...>") are not the user's code: the names they read by strings or inside their try
    blocks are theirs. Before: an import while tracing guarded ~20 of them (loader, name,
    find_spec, ...) absent on every object of the user's, a test each on every call."""
    (tmp_path / "imported_while_tracing.py").write_text("FACTOR = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imported_while_tracing", raising=False)
    compiled = tr.trace(_Importing())
    np.testing.assert_array_equal(compiled(tr.tensor([1.0, -2.0])).numpy(), [3.0, -6.0])
    assert _absence_guards(compiled) == []


class _Reads:
    """A user's object reading a name in the other ways the guards must see: by a name it
    builds, through a property or functools.cached_property, through a layer's own dict."""

    def __init__(self, way: str):
        # (the names read from a list are no string constant of this code)
        self.way, self.kind, self.names, self.base = way, "relu", ["gain"], 2
        self.act0, self.scale0, self.gain = _double, 2, 2
        self.linear = nn.Linear(2, 2)

    @property
    def temperature(self):
        return self._temperature

    @functools.cached_property
    def factor(self):
        return self.base * 1.5

    def __call__(self, x):
        way = self.way
        if way == "built name absent":
            activation = getattr(self, "act_" + self.kind, None)
            return activation(x) if activation is not None else x
        if way == "built name present function":
            for index in range(1):
                x = getattr(self, f"act{index}")(x)
            return x
        if way == "built name present int":
            return x * getattr(self, f"scale{0}")
        if way == "name from a list":
            for name in self.names:
                x = x * getattr(self, name)
            return x
        if way == "property over absent state":
            return x * getattr(self, "temperature", 1.0)
        if way == "cached_property":
            return x * self.factor
        if way == "vars of a layer":
            return x * vars(self.linear).get("scale", 1.0)
        return x * self.linear.__dict__.get("scale", 1.0)


def _double(x):
    return x * 2


@pytest.mark.parametrize("way, change, before, after", [
    ("built name absent", ("act_relu", _double), [1.0, -2.0], [2.0, -4.0]),
    ("built name present function", ("act0", lambda x: x * 5), [2.0, -4.0], [5.0, -10.0]),
    ("built name present int", ("scale0", 5), [2.0, -4.0], [5.0, -10.0]),
    ("name from a list", ("gain", 5), [2.0, -4.0], [5.0, -10.0]),
    ("property over absent state", ("_temperature", 2.0), [1.0, -2.0], [2.0, -4.0]),
    ("cached_property", ("factor", 7.0), [3.0, -6.0], [7.0, -14.0]),
    ("vars of a layer", ("scale", 2.0), [1.0, -2.0], [2.0, -4.0]),
    ("__dict__ of a layer", ("scale", 2.0), [1.0, -2.0], [2.0, -4.0])])
def test_a_name_read_by_a_built_string_a_property_or_a_layers_dict_set_later_traces_again(
        way, change, before, after):
    """The rest of the class: `getattr(self, "act_" + kind, None)` absent, or `getattr(self,
    f"act{i}")` present, whose name no string constant holds (every path and the keys of every
    user's object are guarded then); a property read where absent whose getter reads absent
    state; a cached_property computed while tracing (the walk before did not see it); a tr.nn
    layer's own dict read by `vars(layer).get` or `layer.__dict__.get` (no __getattr__ runs).
    Each gave the value compiled in after the change, silently."""
    function = _Reads(way)
    compiled = tr.trace(function)
    x = tr.tensor([1.0, -2.0], dtype=tr.float64)
    np.testing.assert_array_equal(compiled(x).detach().numpy(), before)
    np.testing.assert_array_equal(function(x).detach().numpy(), before)
    name, value = change
    setattr(function.linear if "layer" in way else function, name, value)
    np.testing.assert_array_equal(function(x).detach().numpy(), after)
    np.testing.assert_array_equal(compiled(x).detach().numpy(), after)
    assert compiled.cache_info().misses == 2


class _Defaulting:
    """A user's class answering for a name it lacks with its own __getattr__."""

    def __getattr__(self, name):
        if name == "temperature":
            return 1.0
        raise AttributeError(name)

    def __call__(self, x):
        return x * self.temperature


class _AnswersEverything:
    """An addict-style object: its __getattr__ answers every name it lacks (`__name__` too)."""

    def __getattr__(self, name):
        return 1.0

    def __call__(self, x):
        return x * self.temperature


@pytest.mark.parametrize("kind", [_Defaulting, _AnswersEverything])
def test_a_name_a_users_getattr_answered_set_later_traces_again(kind):
    """`self.temperature` answered by the class's own __getattr__ (a default) while absent,
    then set: eager's result. Before: the default stayed compiled in, silently; and an object
    answering every name was taken for a traced function (hasattr(value, "python_function")),
    so none of its attributes was guarded (and tr.trace of one raised on its float __name__)."""
    function = kind()
    compiled = tr.trace(function)
    x = tr.tensor([1.0, -2.0], dtype=tr.float64)
    np.testing.assert_array_equal(compiled(x).numpy(), [1.0, -2.0])
    function.temperature = 2.0
    np.testing.assert_array_equal(function(x).numpy(), [2.0, -4.0])
    np.testing.assert_array_equal(compiled(x).numpy(), [2.0, -4.0])
    assert compiled.cache_info().misses == 2
