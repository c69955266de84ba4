"""`tr.nn`: Module, Parameter and the common layers, with PyTorch's names, registration rules and
default initializations (drawn from the generator tr.manual_seed seeds)."""
from __future__ import annotations

import builtins
import math
from collections import OrderedDict
from typing import Iterator, NamedTuple

from tracer.context import no_grad
from tracer.errors import ArgumentError, ShapeMismatchError
from tracer.nn import functional as F
from tracer.nn.embedding_rows import check_sparse, padding_index, pretrained_shape, table
from tracer.nn.module_api import HOOK_CHANGES, ModuleApi
from tracer.nn.module_api import RemovableHandle  # noqa: F401 (torch's place)
from tracer.backward import clear_grads
from tracer.creation import ones, zeros
from tracer.random import rand
from tracer.interop import loaded_tensor
from tracer.layout import fresh
from tracer.serialization import allow_tensor_class
from tracer.device import check_device
from tracer.dispatch import conversion_arguments
from tracer.dtypes import as_dtype, float32
from tracer.ir.types import is_float
from tracer.tensor import Tensor
from tracer.tracing import current_tensor


@allow_tensor_class
class Parameter(Tensor):
    """A tensor that a Module registers as one of its parameters when assigned as an attribute.
    It shares `data`'s buffer and requires grad by default."""

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: builtins.bool = True):
        data = zeros(0) if data is None else data
        if not isinstance(data, Tensor) or data._trace is not None:
            raise ArgumentError("Parameter takes a tensor made outside traced functions")
        return cls._make(data.detach()._eager_array("Parameter"), None,
                         builtins.bool(requires_grad), leaf=True)

    def __init__(self, data: Tensor | None = None, requires_grad: builtins.bool = True):
        pass  # made by __new__ (Tensor's own __init__ refuses direct construction)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()


class _IncompatibleKeys(NamedTuple):
    """What load_state_dict returns, as PyTorch's: a tuple with named fields (scripts read
    `result.missing_keys` after strict=False)."""
    missing_keys: list[str]
    unexpected_keys: list[str]

    def __repr__(self) -> str:
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return (f"_IncompatibleKeys(missing_keys={self.missing_keys}, "
                f"unexpected_keys={self.unexpected_keys})")

    __str__ = __repr__


def _uniform(shape: tuple[int, ...], bound: float, dtype) -> Tensor:
    return ((rand(*shape, dtype=float32 if dtype is None else dtype) * 2 - 1) * bound).detach()


class Module(ModuleApi):
    """Base class of layers and models: assign Parameters and Modules as attributes, define
    `forward`, call the module (the rest of its API: tracer/nn/module_api.py)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        self._init_hooks()

    # Registration ---------------------------------------------------------------------------
    def _registries(self) -> tuple[dict, dict, dict]:
        try:
            return self._parameters, self._buffers, self._modules
        except AttributeError:
            raise ArgumentError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                f"before assigning attributes") from None

    def __setattr__(self, name: str, value) -> None:
        parameters, buffers, modules = self._registries()
        if isinstance(value, (Parameter, Module)):
            target = parameters if isinstance(value, Parameter) else modules
            for registry in (parameters, buffers, modules):
                if registry is not target:
                    registry.pop(name, None)
            self.__dict__.pop(name, None)
            self._non_persistent_buffers_set.discard(name)
            target[name] = value  # a name already there keeps its place, as in PyTorch
        elif name in parameters or name in modules:
            if value is not None:
                kind = "parameter" if name in parameters else "submodule"
                raise ArgumentError(f"cannot assign a {type(value).__name__} to the {kind} "
                                    f"'{name}'; assign a tr.nn.Parameter, a Module or None")
            (parameters if name in parameters else modules)[name] = None
        elif name in buffers:
            buffers[name] = value
        else:
            if name not in self.__dict__ and hasattr(type(self), name):
                # over what its class defines (`lin.forward = f`, a method, a class default): what
                # calling a module runs changed, as with a hook (see HookChanges)
                HOOK_CHANGES.hook_changes += 1
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # Inside a trace, a parameter passed to the traced function reads as its stand-in there,
        # whose .grad the traced backward fills (see current_tensor).
        for registry in ("_parameters", "_buffers", "_modules"):
            entries = self.__dict__.get(registry)
            if entries is not None and name in entries:
                value = entries[name]
                return current_tensor(value) if isinstance(value, Tensor) else value
        return super().__getattr__(name)  # (AbsentNamesNoted's: noted, and AttributeError)

    def __delattr__(self, name: str) -> None:
        for registry in self._registries():
            if name in registry:
                del registry[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, parameter: Parameter | None) -> None:
        if parameter is not None and not isinstance(parameter, Parameter):
            raise ArgumentError(f"register_parameter takes a tr.nn.Parameter or None, got "
                                f"{type(parameter).__name__}")
        self._parameters[name] = parameter

    def add_module(self, name: str, module: Module | None) -> None:
        self._modules[name] = module

    # Traversal ------------------------------------------------------------------------------
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: builtins.bool = True) -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo  # (PyTorch's order)
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                                remove_duplicate)

    def modules(self) -> Iterator[Module]:
        return (module for _, module in self.named_modules())

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((name, m) for name, m in self._modules.items() if m is not None)

    def children(self) -> Iterator[Module]:
        return (module for _, module in self.named_children())

    def _named_members(self, registry: str, prefix: str, recurse: builtins.bool,
                       remove_duplicate: builtins.bool = True):
        seen: set[int] = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{module_prefix}.{name}" if module_prefix else name), current_tensor(value)

    # State ----------------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict:
        """Every parameter and persistent buffer by dotted name, detached (sharing buffers)."""
        state = OrderedDict()
        for prefix, module in self.named_modules():
            for registry in (module._parameters, module._buffers):
                for name, value in registry.items():
                    if value is not None and name not in module._non_persistent_buffers_set:
                        # (fresh: a buffer that is a view-copy, a mask made with .view(), is the
                        # tensor the module reads, and loads in place as PyTorch's view does)
                        state[f"{prefix}.{name}" if prefix else name] = fresh(value.detach())
        return state

    def load_state_dict(self, state_dict, strict: builtins.bool = True):
        """Copy the values of `state_dict` into the parameters and buffers in place (shapes must
        match); with `strict`, the names must match exactly. Returns the missing and the
        unexpected names as a named tuple (missing_keys, unexpected_keys)."""
        own = self.state_dict()
        missing = [name for name in own if name not in state_dict]
        unexpected = [name for name in state_dict if name not in own]
        if strict and (missing or unexpected):
            raise ArgumentError(f"load_state_dict: missing keys {missing}, unexpected keys "
                                f"{unexpected}")
        # every value checked before any is copied: a refused load leaves the module as it was
        sources = {name: loaded_tensor(state_dict[name], f"load_state_dict: {name}")
                   for name in own if name in state_dict}
        for name, source in sources.items():
            if source.shape != own[name].shape:
                raise ShapeMismatchError(f"load_state_dict: {name} has shape {list(source.shape)} "
                                         f"here and {list(own[name].shape)} in the module")
        with no_grad():
            for name, source in sources.items():
                own[name].copy_(source)
        return _IncompatibleKeys(missing, unexpected)

    def train(self, mode: builtins.bool = True) -> Module:
        for module in self.modules():
            object.__setattr__(module, "training", builtins.bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: builtins.bool = True) -> Module:
        for parameter in self.parameters():
            parameter.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: builtins.bool = True) -> None:
        clear_grads(self.parameters(), set_to_none)

    def to(self, *args, **kwargs) -> Module:
        """Convert every float parameter and buffer to a float dtype, given as Tensor.to takes
        it; a device can only be the CPU, where they are. As PyTorch's: the parameters stay the
        same objects (an optimizer made before still updates them) and integer buffers such as
        BatchNorm's num_batches_tracked stay integers."""
        dtype, device, _ = conversion_arguments(args, kwargs.pop("dtype", None),
                                                kwargs.pop("device", None), False)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise ArgumentError(f"Module.to got unexpected keywords {sorted(kwargs)}")
        check_device(device)
        if dtype is None:
            return self
        dtype = as_dtype(dtype)
        if not is_float(dtype):
            raise ArgumentError(f"Module.to only accepts float dtypes, got {dtype}; convert "
                                f"integer tensors one by one")
        for module in self.modules():
            for parameter in module._parameters.values():
                if parameter is not None and is_float(parameter.dtype):
                    parameter.data = parameter.detach().to(dtype)
                    if parameter.grad is not None:
                        parameter.grad = parameter.grad.to(dtype)
            for name, buffer in module._buffers.items():
                if buffer is not None and is_float(buffer.dtype):
                    module._buffers[name] = buffer.to(dtype)
        return self

    def cpu(self) -> Module:
        return self

    def double(self) -> Module:
        return self.to("float64")

    def float(self) -> Module:
        return self.to("float32")

    # Calling --------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks or self._forward_hooks:  # (read here: guarded when traced)
            return self._call_with_hooks(args, kwargs)
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        if not lines:
            return f"{type(self).__name__}({self.extra_repr()})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features); PyTorch's initialization:
    uniform in +-1/sqrt(in_features) for both (kaiming_uniform with a = sqrt 5)."""

    def __init__(self, in_features: int, out_features: int, bias: builtins.bool = True,
                 dtype=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.weight = Parameter(_uniform((out_features, in_features), bound, dtype))
        self.bias = Parameter(_uniform((out_features,), bound, dtype)) if bias else None

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A table of `num_embeddings` vectors, standard normal at first (the padding row zero), or
    `_weight`; `max_norm`, `norm_type`, `scale_grad_by_freq` as F.embedding's."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: builtins.bool = False, sparse: builtins.bool = False,
                 _weight: Tensor | None = None, _freeze: builtins.bool = False,
                 dtype=None) -> None:
        super().__init__()
        check_sparse(sparse, "Embedding")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.padding_idx = padding_index(padding_idx, num_embeddings, "Embedding")
        weight = table(num_embeddings, embedding_dim, self.padding_idx, _weight, dtype, "Embedding")
        self.weight = Parameter(weight, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: builtins.bool = True,
                        padding_idx: int | None = None, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: builtins.bool = False,
                        sparse: builtins.bool = False) -> "Embedding":
        """An Embedding holding the 2-D `embeddings` (its buffer, as PyTorch's), trained unless
        `freeze`."""
        return cls(*pretrained_shape(embeddings, "Embedding"), padding_idx, max_norm, norm_type,
                   scale_grad_by_freq, sparse, _weight=embeddings, _freeze=freeze)

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        padding = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        norm = "" if self.max_norm is None else f", max_norm={self.max_norm}"
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}{norm}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5,
                 elementwise_affine: builtins.bool = True, bias: builtins.bool = True,
                 dtype=None) -> None:
        super().__init__()
        self.normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                                 else tuple(normalized_shape))
        self.eps = eps
        dtype = float32 if dtype is None else dtype
        affine = elementwise_affine
        self.weight = Parameter(ones(*self.normalized_shape, dtype=dtype)) if affine else None
        self.bias = (Parameter(zeros(*self.normalized_shape, dtype=dtype))
                     if affine and bias else None)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    def __init__(self, p: float = 0.5, inplace: builtins.bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ArgumentError(f"dropout probability must be between 0 and 1, got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, self.approximate)


class Tanh(Module):
    def forward(self, input: Tensor) -> Tensor:
        return input.tanh()


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:
        return F.softplus(input, self.beta, self.threshold)
