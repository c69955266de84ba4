"""gradcheck: analytic gradients against central finite differences, as torch.autograd.gradcheck."""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from tracer.errors import ArgumentError, GradcheckError
from tracer.creation import tensor
from tracer.tensor import Tensor
from tracer.gradients import grad as autograd_grad
from tracer.transforms import grad


def _outputs(result) -> list[Tensor]:
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    return [r for r in results if isinstance(r, Tensor) and r.dtype.kind == "f"]


class Mismatch(NamedTuple):
    """The first Jacobian entry where analytic and numerical gradients disagree."""
    output: int
    output_element: tuple[int, ...]
    input: int                # position in the inputs
    element: tuple[int, ...]  # of that input
    analytic: float
    numerical: float


def gradcheck(fn: Callable, inputs, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, *, raise_exception: bool = True, fast_mode: bool = False,
              nondet_tol: float = 0.0) -> bool:
    """Check the gradient of every float output of `fn(*inputs)` with respect to every input tensor
    that requires grad. Works for eager functions and for `@tr.trace`d ones (whose gradients are
    then computed by a traced, compiled backward). Returns True or raises GradcheckError (returns
    False with `raise_exception=False`). `fast_mode` (PyTorch's check of one random projection of
    the Jacobian) is accepted and checks the whole Jacobian, which implies it; `nondet_tol` is
    accepted because the backward here is deterministic."""
    del fast_mode, nondet_tol
    mismatch = first_mismatch(fn, inputs, eps, atol, rtol)
    if mismatch is not None:
        if not raise_exception:
            return False
        raise GradcheckError(
            f"gradcheck: Jacobian mismatch for output {mismatch.output} element "
            f"{mismatch.output_element} with respect to input {mismatch.input} element "
            f"{mismatch.element}: analytic {mismatch.analytic!r}, numerical "
            f"{mismatch.numerical!r} (atol={atol}, rtol={rtol})")
    return True


def first_mismatch(fn: Callable, inputs, eps: float = 1e-6, atol: float = 1e-5,
                   rtol: float = 1e-3) -> Mismatch | None:
    """gradcheck's comparison: the first disagreeing Jacobian entry, or None."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    positions = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not positions:
        raise ArgumentError("gradcheck needs at least one input tensor with requires_grad=True")
    python_function = getattr(fn, "python_function", fn)
    arrays = [np.array(x.detach().numpy(), copy=True) if isinstance(x, Tensor) else x for x in inputs]

    def evaluate(values) -> list[np.ndarray]:
        args = [tensor(v) if isinstance(v, np.ndarray) else v for v in values]
        return [o.detach().numpy().astype(np.float64) for o in _outputs(fn(*args))]

    def weighted_sum(seeds, *args):
        outputs = _outputs(python_function(*args))
        total = None
        for output, seed in zip(outputs, seeds):
            term = (output * seed).sum()
            total = term if total is None else total + term
        return total

    vjp = grad(weighted_sum, argnums=tuple(p + 1 for p in positions))
    if fn is not python_function:  # a traced function: check the traced backward too
        # traced the same way (tracer/ does not import runtime/); fn's static arguments stay
        # static, shifted by one: the vjp takes the seeds first
        vjp = type(fn)(vjp, static_argnums=tuple(n + 1 for n in getattr(fn, "static_argnums", ())))
    reference = evaluate(arrays)
    offsets = np.cumsum([0] + [r.size for r in reference])

    def flat_outputs(values) -> np.ndarray:
        return np.concatenate([r.reshape(-1) for r in evaluate(values)] + [np.zeros(0)])

    for position in positions:
        array = arrays[position]
        numeric = np.empty((offsets[-1], array.size))
        for element in range(array.size):
            shifted = list(arrays)
            shifted[position] = array.copy()
            shifted[position].reshape(-1)[element] += eps
            plus = flat_outputs(shifted)
            shifted[position].reshape(-1)[element] -= 2 * eps
            numeric[:, element] = (plus - flat_outputs(shifted)) / (2 * eps)
        analytic = np.empty_like(numeric)
        for row in range(offsets[-1]):
            seeds = [np.zeros(r.shape, r.dtype) for r in reference]
            which = int(np.searchsorted(offsets, row, side="right")) - 1
            seeds[which].reshape(-1)[row - offsets[which]] = 1.0
            leaves = [tensor(a, requires_grad=i in positions) if isinstance(a, np.ndarray) else a
                      for i, a in enumerate(arrays)]
            gradients = vjp([tensor(s) for s in seeds], *leaves)
            # (connected to the leaves, as torch.func's: read, not differentiated)
            analytic[row] = gradients[positions.index(position)].detach().numpy().reshape(-1)
        bad = np.abs(analytic - numeric) > atol + rtol * np.abs(numeric)
        if bad.any():
            row, element = map(int, np.unravel_index(int(np.argmax(bad)), bad.shape))
            which = int(np.searchsorted(offsets, row, side="right")) - 1
            output_element = np.unravel_index(row - offsets[which], reference[which].shape)
            return Mismatch(which, tuple(map(int, output_element)), position,
                            tuple(map(int, np.unravel_index(element, array.shape))),
                            float(analytic[row, element]), float(numeric[row, element]))
    return None


def gradgradcheck(fn: Callable, inputs, grad_outputs=None, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, *, raise_exception: bool = True, fast_mode: bool = False,
                  nondet_tol: float = 0.0) -> bool:
    """Check second-order gradients as torch.autograd.gradgradcheck: `gradcheck` of the function
    that maps (inputs, grad_outputs) to the gradients of fn's outputs weighted by grad_outputs
    (computed with create_graph=True), with respect to both. `grad_outputs` default to random
    values (float64 standard normal, fixed seed), as PyTorch's do."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    python_function = getattr(fn, "python_function", fn)
    if grad_outputs is None:
        random = np.random.default_rng(0)
        outputs = _outputs(python_function(*inputs))
        grad_outputs = [tensor(random.standard_normal(o.shape).astype(o.dtype),
                               requires_grad=True) for o in outputs]
    grad_outputs = tuple(grad_outputs) if isinstance(grad_outputs, (tuple, list)) else (
        grad_outputs,)
    count = len(inputs)
    wanted = [isinstance(x, Tensor) and x.requires_grad for x in inputs]

    def first_derivative(*values):
        # gradcheck's finite differences call this with inputs that do not require grad: make
        # them leaves here (its analytic pass gives them connected, and they are kept)
        args = [x if not want or x.requires_grad else x.detach().requires_grad_()
                for x, want in zip(values[:count], wanted)]
        outputs = _outputs(python_function(*args))
        differentiated = [x for x, want in zip(args, wanted) if want]
        seeds = [s.detach() if not s.requires_grad else s for s in values[count:]]
        gradients = autograd_grad(outputs, differentiated, seeds, create_graph=True,
                                  allow_unused=True, materialize_grads=True)
        return tuple(gradients)

    function = first_derivative
    if fn is not python_function:  # traced: check the traced second-order backward too
        function = type(fn)(first_derivative)
    return gradcheck(function, inputs + grad_outputs, eps, atol, rtol,
                     raise_exception=raise_exception)
