"""examples/cnn_digits.py and examples/fused_conv_bn.py: the CNN learns the digits (scikit-learn's,
or the synthetic stand-in without it), resumes from its checkpoint exactly, and its compiled steps
equal the same CNN and AdamW in
PyTorch from the same weights; the ported conv-BN Function equals the tutorial's in PyTorch,
values and gradients, eagerly and traced, and a network using it trains as PyTorch's does."""
import numpy as np
import pytest
import torch

import tracer as tr
import cnn_digits
import fused_conv_bn


def test_cnn_learns_the_digits_and_resumes_from_its_checkpoint_as_if_it_had_not_stopped(
        capsys, tmp_path):
    straight, stopped = tmp_path / "straight.pt", tmp_path / "stopped.pt"
    assert cnn_digits.main(["--epochs", "4", "--checkpoint", str(straight)]) >= 0.85
    assert "test accuracy" in capsys.readouterr().out
    cnn_digits.main(["--epochs", "4", "--checkpoint", str(stopped), "--stop-after", "2"])
    assert tr.load(stopped, weights_only=True)["epoch"] == 2
    cnn_digits.main(["--epochs", "4", "--checkpoint", str(stopped), "--resume"])
    expected, actual = (tr.load(path, weights_only=True) for path in (straight, stopped))
    assert actual["epoch"] == expected["epoch"] == 4
    for name, value in expected["model"].items():  # the same steps: the same numbers
        np.testing.assert_array_equal(actual["model"][name].numpy(), value.numpy(), err_msg=name)
    for moments, saved in zip(actual["optimizer"]["state"].values(),
                              expected["optimizer"]["state"].values()):
        for key, value in saved.items():
            np.testing.assert_array_equal(np.asarray(moments[key]), np.asarray(value))
    # the cosine schedule over 4 epochs, as PyTorch's CosineAnnealingLR gives it (0 at the end)
    parameter = torch.nn.Parameter(torch.zeros(1))
    reference = torch.optim.AdamW([parameter], lr=3e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(reference, T_max=4)
    rates = []
    for _ in range(4):
        reference.step()
        schedule.step()
        rates.append(reference.param_groups[0]["lr"])
    assert actual["optimizer"]["param_groups"][0]["lr"] == pytest.approx(rates[-1], abs=1e-15)
    assert actual["schedule"]["_last_lr"] == pytest.approx([rates[-1]], abs=1e-15)


def _torch_cnn(model):
    nn = torch.nn
    reference = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(1), nn.Linear(128, 10))
    names = {f"features.{i}": str(i) for i in range(8)} | {"classifier": "9"}
    state = {}
    for name, value in model.state_dict().items():
        module, _, field = name.rpartition(".")
        state[f"{names[module]}.{field}"] = torch.tensor(value.numpy())
    reference.load_state_dict(state)
    return reference


def test_cnn_steps_equal_torch():
    (x, y), _, _ = cnn_digits.load()
    tr.manual_seed(1)
    model = cnn_digits.CNN()
    reference = _torch_cnn(model)
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    step = cnn_digits.make_step(model, tr.optim.AdamW(model.parameters(), lr=1e-3), x, y)
    inputs, labels = torch.tensor(x.numpy()), torch.tensor(y.numpy())
    for rows in cnn_digits.batches(x.shape[0], 64)[:5]:
        index = torch.tensor(rows.numpy())
        optimizer.zero_grad()
        expected = torch.nn.functional.cross_entropy(reference(inputs[index]), labels[index])
        expected.backward()
        optimizer.step()
        np.testing.assert_allclose(step(rows).item(), expected.item(), rtol=1e-5)
    running = model.features[1].running_var.numpy()
    np.testing.assert_allclose(running, reference[1].running_var.numpy(), rtol=1e-5)
    model.eval(), reference.eval()
    np.testing.assert_allclose(model(x[:50]).detach().numpy(),
                               reference(inputs[:50]).detach().numpy(), rtol=1e-4, atol=1e-4)


class TorchFusedConvBN(torch.autograd.Function):
    """The tutorial's FusedConvBN2DFunction (its helpers inlined through the port's, which take
    torch tensors as well: they use only operations both libraries spell alike)."""

    @staticmethod
    def forward(ctx, X, conv_weight, eps=1e-3):
        ctx.save_for_backward(X, conv_weight)
        X = torch.nn.functional.conv2d(X, conv_weight)
        sum = X.sum(dim=(0, 2, 3))
        var = X.var(unbiased=True, dim=(0, 2, 3))
        N = X.numel() / X.size(1)
        sqrt_var = torch.sqrt(var)
        ctx.eps, ctx.sum, ctx.N, ctx.sqrt_var = eps, sum, N, sqrt_var
        X.sub_(fused_conv_bn.unsqueeze_all(sum / N))
        X.div_(fused_conv_bn.unsqueeze_all(sqrt_var + eps))
        return X

    @staticmethod
    def backward(ctx, grad_out):
        X, conv_weight = ctx.saved_tensors
        X_conv_out = torch.nn.functional.conv2d(X, conv_weight)
        grad_out = fused_conv_bn.batch_norm_backward(grad_out, X_conv_out, ctx.sum, ctx.sqrt_var,
                                                     ctx.N, ctx.eps)
        grad_X = torch.nn.functional.conv_transpose2d(grad_out, conv_weight)
        grad_weight = torch.nn.functional.conv2d(X.transpose(0, 1),
                                                 grad_out.transpose(0, 1)).transpose(0, 1)
        return grad_X, grad_weight, None


def test_fused_function_equals_the_tutorials():
    from torch_oracle import compare_with_torch
    generator = np.random.default_rng(0)
    arrays = [generator.random((3, 4, 7, 6)), generator.random((5, 4, 3, 3))]
    for traced in (False, True):
        compare_with_torch(fused_conv_bn.FusedConvBN2DFunction.apply, TorchFusedConvBN.apply,
                           arrays, traced=traced)
    assert fused_conv_bn.gradchecks()


def test_fused_network_trains_as_torch():
    losses = fused_conv_bn.train(steps=4)
    tr.manual_seed(0)  # the weights and data train() starts from
    model = fused_conv_bn.Net(size=12)
    images = tr.randn(16, 1, 12, 12)
    labels = (images.sum((1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()
    weights = {name: torch.tensor(value.numpy()) for name, value in model.state_dict().items()}
    conv1, fc1, fc2 = (torch.nn.Conv2d(1, 32, 3), torch.nn.Linear(1024, 128),
                       torch.nn.Linear(128, 10))
    for name, module in (("conv1", conv1), ("fc1", fc1), ("fc2", fc2)):
        module.load_state_dict({"weight": weights[f"{name}.weight"],
                                "bias": weights[f"{name}.bias"]})
    conv_weight = torch.nn.Parameter(weights["bn.conv_weight"])
    parameters = [*conv1.parameters(), conv_weight, *fc1.parameters(), *fc2.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=0.02)
    x, y = torch.tensor(images.numpy()), torch.tensor(labels.numpy())
    F = torch.nn.functional
    for loss in losses:
        optimizer.zero_grad()
        hidden = F.relu(TorchFusedConvBN.apply(F.relu(conv1(x)), conv_weight, 1e-3))
        hidden = F.relu(fc1(F.max_pool2d(hidden, 2).flatten(1)))
        expected = F.nll_loss(F.log_softmax(fc2(hidden), dim=1), y)
        expected.backward()
        optimizer.step()
        np.testing.assert_allclose(loss, expected.item(), rtol=1e-4)
