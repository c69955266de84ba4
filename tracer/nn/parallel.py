"""`tr.nn.parallel.DistributedDataParallel`: PyTorch's DDP on tracer.distributed (MPI).

Wrapping broadcasts rank 0's parameters and buffers to every rank; after each `.backward()` that
follows a forward through the wrapper, the gradients are averaged over the ranks. As Horovod's
tensor fusion and DDP's buckets do, the gradients of one dtype travel together: one all_reduce of
their concatenation, split back into each `.grad`. Inside `@tr.trace` that all_reduce is a node of
the compiled step, between its backward and whatever reads the gradients (the optimizer's step).
"""
from __future__ import annotations

from tracer import distributed
from tracer.backward import after_backward
from tracer.context import is_grad_enabled, no_grad
from tracer.errors import ArgumentError
from tracer.functional import cat
from tracer.layout import fresh
from tracer.nn.modules import Module
from tracer.tracing import current_tensor


class DistributedDataParallel(Module):
    """`DistributedDataParallel(module)`: `module` replicated on every rank, its gradients averaged."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, **options) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise ArgumentError(f"DistributedDataParallel wraps a tr.nn.Module, got "
                                f"{type(module).__name__}")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        named = [*module.named_parameters(), *module.named_buffers()]
        distributed.check_same_on_every_rank(
            "the wrapped module's parameters and buffers",
            [(name, tuple(t.shape), str(t.dtype)) for name, t in named])
        for _, tensor in named:
            # fresh: a buffer may be a view's result, a copy here (a mask made with .view()), which
            # copy_ refuses to change; it is the tensor the module reads, as PyTorch's view is
            distributed.broadcast(fresh(tensor.detach()), src=0)

    def forward(self, *arguments, **keywords):
        if self.training and is_grad_enabled() and any(p.requires_grad
                                                        for p in self.module.parameters()):
            after_backward(self._average_gradients)
        return self.module(*arguments, **keywords)

    def _average_gradients(self) -> None:
        """Each gradient replaced by its average over the ranks: one all_reduce per dtype."""
        groups: dict = {}
        for parameter in self.module.parameters():
            gradient = current_tensor(parameter).grad
            if gradient is not None:
                groups.setdefault(str(gradient.dtype), []).append(gradient)
        with no_grad():
            for gradients in groups.values():
                flat = cat([g.reshape(-1) for g in gradients])
                distributed.all_reduce(flat, op=distributed.ReduceOp.AVG)
                offset = 0
                for gradient in gradients:
                    size = gradient.numel()
                    gradient.copy_(flat[offset:offset + size].reshape(*gradient.shape))
                    offset += size
