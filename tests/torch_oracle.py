"""PyTorch as the oracle: run the same function on the same values in tracer (eagerly or traced)
and in torch, and compare the results and the gradients of every float input."""
import numpy as np
import torch

import tracer as tr

# float64: the compositions round differently from torch's kernels by a few ulp per operation.
# float32: the same, where a sum, a softmax or a mean rounds relative to its largest terms, so the
# absolute part scales with the largest magnitude of the expected result (about 16 ulp of it).
TOLERANCES = {np.dtype(np.float64): dict(rtol=1e-10, atol=1e-12),
              np.dtype(np.float32): dict(rtol=1e-5, atol=1e-6)}


def _limits(expected: np.ndarray, tolerance) -> dict:
    if tolerance is not None:
        return tolerance
    limits = dict(TOLERANCES.get(expected.dtype, dict(rtol=0, atol=0)))
    if expected.dtype == np.float32 and expected.size:
        limits["atol"] *= max(1.0, float(np.abs(expected[np.isfinite(expected)]).max(initial=0)))
    return limits


def _as_list(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def compare_with_torch(function, torch_function, arrays, traced=False, gradients=True,
                       tolerance=None, seed=0):
    """`function(*tensors)` (through @tr.trace if `traced`) against `torch_function(*tensors)`:
    equal outputs, and equal gradients of sum(outputs * random weights) for each float input."""
    arrays = [np.array(a) for a in arrays]  # copies: torch refuses negative strides
    requires = [gradients and a.dtype.kind == "f" for a in arrays]
    ours = [tr.tensor(np.asarray(a), requires_grad=r) for a, r in zip(arrays, requires)]
    theirs = [torch.tensor(np.asarray(a), requires_grad=r) for a, r in zip(arrays, requires)]
    run = tr.trace(function) if traced else function
    outputs, expected = _as_list(run(*ours)), _as_list(torch_function(*theirs))
    assert len(outputs) == len(expected)
    generator = np.random.default_rng(seed)
    ours_total, theirs_total = 0, 0
    for output, reference in zip(outputs, expected):
        assert output.shape == tuple(reference.shape), (output.shape, reference.shape)
        reference_values = reference.detach().numpy()
        assert output.dtype == reference_values.dtype, (output.dtype, reference_values.dtype)
        np.testing.assert_allclose(output.detach().numpy(), reference_values,
                                   **_limits(reference_values, tolerance))
        if output.requires_grad:
            weights = generator.standard_normal(output.shape).astype(reference_values.dtype)
            ours_total = ours_total + (output * tr.tensor(weights)).sum()
            theirs_total = theirs_total + (reference * torch.tensor(weights)).sum()
    if not any(requires) or isinstance(ours_total, int):
        return outputs
    ours_total.backward()
    theirs_total.backward()
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        if not requires[index]:
            continue
        expected_grad = reference.grad
        if expected_grad is None:
            assert mine.grad is None or not mine.grad.numpy().any(), f"gradient of input {index}"
            continue
        assert mine.grad is not None, f"no gradient for input {index}"
        expected_grad = expected_grad.numpy(force=True)  # (force: a ZeroTensor, as sgn's)
        np.testing.assert_allclose(mine.grad.numpy(), expected_grad,
                                   **_limits(expected_grad, tolerance),
                                   err_msg=f"gradient of input {index}")
    return outputs


def paired_mlps(seed: int, inputs: int, hidden: int, outputs: int, activation: str):
    """Linear-activation-Linear in tracer (seeded with `seed`) and the same in torch with the same
    weights: a model for comparing training loops step by step."""
    tr.manual_seed(seed)
    ours = tr.nn.Sequential(tr.nn.Linear(inputs, hidden), getattr(tr.nn, activation)(),
                            tr.nn.Linear(hidden, outputs))
    theirs = torch.nn.Sequential(torch.nn.Linear(inputs, hidden), getattr(torch.nn, activation)(),
                                 torch.nn.Linear(hidden, outputs))
    with torch.no_grad():
        for mine, reference in zip(ours.parameters(), theirs.parameters()):
            reference.copy_(torch.tensor(mine.detach().numpy()))
    return ours, theirs


def _key_part(packed) -> slice:
    """Where the key's part lies in an in_proj_bias that packs query, key and value."""
    return slice(packed.shape[0] // 3, 2 * packed.shape[0] // 3)


def key_biases(module) -> dict[str, np.ndarray]:
    """The key's part of each attention's packed in_proj_bias (query, key, value) of `module`."""
    return {name: value.detach().numpy()[_key_part(value)].copy()
            for name, value in module.named_parameters() if name.endswith("in_proj_bias")}


def assert_trained_like_torch(ours, theirs, key_biases_before: dict[str, np.ndarray],
                              steps: int, lr: float, eps: float = 1e-8,
                              decoupled_weight_decay: float = 0.0) -> None:
    """The parameters of `ours` after `steps` Adam-family steps equal those of `theirs` (float64),
    but for the keys' biases, compared with their values before (`key_biases`): a key's bias adds
    q.b_k to every score of a query, which softmax ignores, so its gradient is 0 exactly and both
    frameworks' are rounding noise (~1e-17, which differs: their sums are ordered differently).
    Adam divides that noise by eps, so each step moves the bias by at most
    lr * |noise| / eps: ~1e-9 for noise below 1e-15, far below any real gradient's step (~lr),
    and far above a tolerance of 1e-9 relative (a flaky failure at 7e-11, 2026-11-27). AdamW's
    decoupled weight decay shrinks them by (1 - lr * decay) each step meanwhile."""
    drift, shrunk = steps * lr * 1e-15 / eps, (1 - lr * decoupled_weight_decay) ** steps
    for module in ours, theirs:
        for name, after in key_biases(module).items():
            np.testing.assert_allclose(after, key_biases_before[name] * shrunk, rtol=0, atol=drift,
                                       err_msg=name)
    for (name, mine), (_, reference) in zip(ours.named_parameters(), theirs.named_parameters()):
        mine, reference = mine.detach().numpy().copy(), reference.detach().numpy().copy()
        if name.endswith("in_proj_bias"):
            mine[_key_part(mine)] = reference[_key_part(reference)] = 0  # (checked above)
        np.testing.assert_allclose(mine, reference, rtol=1e-9, atol=1e-12, err_msg=name)
