"""The part of `tr.nn.Module`'s API a PyTorch user reaches for beyond registration and state
(torch/nn/modules/module.py, 2.13): `apply`, `get_submodule`/`get_parameter`/`get_buffer`,
non-persistent buffers and forward (pre-)hooks with the handles that remove them.

Hooks run inside `Module.__call__`, eagerly and while `@tr.trace` traces: what they compute is
part of the compiled code. Registering or removing one therefore traces again (runtime/guards.py
guards HOOK_CHANGES)."""
from __future__ import annotations

import builtins
import warnings
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator

from tracer.context import AbsentNamesNoted
from tracer.errors import TracerError
from tracer.tensor import Tensor

# The attributes holding a module's hooks, as PyTorch names them.
HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class HookChanges:
    """How many times a forward hook was registered or removed, on any module, or an attribute
    set on a module over what its class defines (`lin.forward = f`, a method replaced: what
    calling it runs, as a hook). runtime/guards.py guards this one number for every traced
    function that calls a Module: such a change anywhere traces those functions again (one number
    to check per call, where a guard on every module's hook dicts cost 240 us a call of a
    12-layer TransformerEncoder)."""

    def __init__(self) -> None:
        self.hook_changes = 0


HOOK_CHANGES = HookChanges()


class ForwardPreHookError(TracerError, RuntimeError):
    """A forward pre-hook registered with_kwargs=True returned something other than None or an
    (args, kwargs) pair (PyTorch raises RuntimeError)."""


class RemovableHandle:
    """What register_forward_hook and register_forward_pre_hook return (torch.utils.hooks'):
    `.remove()` takes the hook away again, also used as a context manager. It holds the hook
    dicts weakly, so it does not keep a module alive."""

    id: int
    next_id: int = 0

    def __init__(self, hooks_dict: OrderedDict, *, extra_dict=None) -> None:
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        extra = [extra_dict] if isinstance(extra_dict, dict) else list(extra_dict or ())
        self.extra_dict_ref = tuple(weakref.ref(entries) for entries in extra)

    def remove(self) -> None:
        hooks = self.hooks_dict_ref()
        if hooks is not None and self.id in hooks:
            HOOK_CHANGES.hook_changes += 1
        for reference in (self.hooks_dict_ref, *self.extra_dict_ref):
            entries = reference()
            if entries is not None and self.id in entries:
                del entries[self.id]

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exception) -> None:
        self.remove()


def _module_name(module) -> str:
    return type(module).__name__


def typename(value) -> str:
    """What torch.typename calls a value in messages ("numpy.ndarray", "int")."""
    module = getattr(value, "__module__", "") or ""
    name = getattr(value, "__qualname__", getattr(value, "__name__", None))
    if name is None:
        module, name = type(value).__module__ or "", type(value).__qualname__
    return name if module in ("", "builtins") else f"{module}.{name}"


class ModuleApi(AbsentNamesNoted):
    """Methods of tr.nn.Module (tracer/nn/modules.py), which inherits them."""

    def _init_hooks(self) -> None:
        for name in HOOK_DICTS:
            object.__setattr__(self, name, OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())

    def __setstate__(self, state: dict) -> None:
        """Unpickling, as PyTorch's: a module pickled before it had hooks gets empty ones."""
        self.__dict__.update(state)
        for name in HOOK_DICTS:
            self.__dict__.setdefault(name, OrderedDict())
        self.__dict__.setdefault("_non_persistent_buffers_set", set())

    # Parameters and buffers -----------------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: builtins.bool = True,
                         remove_duplicate: builtins.bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: builtins.bool = True) -> Iterator[Tensor]:
        return (parameter for _, parameter in self.named_parameters(recurse=recurse))

    def register_buffer(self, name: str, tensor: Tensor | None,
                        persistent: builtins.bool = True) -> None:
        """A tensor that is part of the module's state but not a parameter: in buffers() and
        moved by .to(); in state_dict() only if `persistent`. PyTorch's checks and errors."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {typename(name)}")
        if "." in name:
            raise KeyError('buffer name can\'t contain "."')
        if name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{typename(tensor)}' object to buffer '{name}' "
                            f"(tracer Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def named_buffers(self, prefix: str = "", recurse: builtins.bool = True,
                      remove_duplicate: builtins.bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: builtins.bool = True) -> Iterator[Tensor]:
        return (buffer for _, buffer in self.named_buffers(recurse=recurse))

    # Look-ups -------------------------------------------------------------------------------
    def apply(self, fn: Callable) -> ModuleApi:
        """Call `fn` on every submodule (children first, recursively) and then on self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def get_submodule(self, target: str) -> ModuleApi:
        """The submodule at the dotted path `target` ("" is self)."""
        if target == "":
            return self
        module = self
        for item in target.split("."):
            if not hasattr(module, item):
                raise AttributeError(f"{_module_name(module)} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, ModuleApi):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module

    def _get_member(self, target: str) -> tuple[Any, Any, str]:
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{_module_name(module)} has no attribute `{name}`")
        return module, getattr(module, name), name

    def get_parameter(self, target: str) -> Tensor:
        """The parameter at the dotted path `target` ("block.0.weight")."""
        module, parameter, name = self._get_member(target)
        if name not in module._parameters or parameter is None:
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return parameter

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at the dotted path `target` ("norm.running_mean")."""
        module, buffer, name = self._get_member(target)
        if name not in module._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return buffer

    # Hooks ----------------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable, *, prepend: builtins.bool = False,
                                  with_kwargs: builtins.bool = False) -> RemovableHandle:
        """`hook(module, args)` before every forward (with_kwargs: `hook(module, args, kwargs)`);
        what it returns other than None replaces the arguments (a value not a tuple is the one
        positional argument; with_kwargs, an (args, kwargs) pair)."""
        handle = RemovableHandle(self._forward_pre_hooks,
                                 extra_dict=self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        HOOK_CHANGES.hook_changes += 1
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook: Callable, *, prepend: builtins.bool = False,
                              with_kwargs: builtins.bool = False,
                              always_call: builtins.bool = False) -> RemovableHandle:
        """`hook(module, args, output)` after every forward (with_kwargs: `hook(module, args,
        kwargs, output)`); what it returns other than None replaces the output. always_call: it
        runs also when forward raises (its own error then only warns)."""
        handle = RemovableHandle(self._forward_hooks, extra_dict=[
            self._forward_hooks_with_kwargs, self._forward_hooks_always_called])
        self._forward_hooks[handle.id] = hook
        HOOK_CHANGES.hook_changes += 1
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    def _call_with_hooks(self, args: tuple, kwargs: dict):
        """forward between the hooks, in PyTorch's order (_call_impl)."""
        result, called = None, set()
        try:
            for hook_id, hook in list(self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    changed = hook(self, args, kwargs)
                    if changed is not None:
                        if not (isinstance(changed, tuple) and len(changed) == 2):
                            raise ForwardPreHookError(
                                f"forward pre-hook must return None or a tuple of (new_args, "
                                f"new_kwargs), but got {changed}.")
                        args, kwargs = changed
                else:
                    changed = hook(self, args)
                    if changed is not None:
                        args = changed if isinstance(changed, tuple) else (changed,)
            result = self.forward(*args, **kwargs)
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called:
                    called.add(hook_id)
                result = self._run_forward_hook(hook_id, hook, args, kwargs, result)
            return result
        except Exception:
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called and hook_id not in called:
                    try:
                        result = self._run_forward_hook(hook_id, hook, args, kwargs, result)
                    except Exception as error:
                        warnings.warn(f"module forward hook with ``always_call=True`` raised an "
                                      f"exception that was silenced as another error was "
                                      f"raised in forward: {error}", stacklevel=2)
            raise

    def _run_forward_hook(self, hook_id: int, hook: Callable, args: tuple, kwargs: dict, result):
        if hook_id in self._forward_hooks_with_kwargs:
            changed = hook(self, args, kwargs, result)
        else:
            changed = hook(self, args, result)
        return result if changed is None else changed

