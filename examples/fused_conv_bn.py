"""PyTorch's tutorial "Fusing Convolution and Batch Norm using Custom Function", ported: a
custom Function whose forward runs a convolution and the tutorial's batch norm and saves only
the convolution's input, and whose hand-written backward recomputes the convolution and applies
the batch norm's and the convolution's gradients (the convolution's own written with conv2d and
conv_transpose2d, as in the tutorial). The code is the tutorial's with `torch` replaced by `tr`;
its gradients are checked with tr.gradcheck in float64, and a small network using it is trained
by a traced step, where the hand-written backward is compiled with everything else.

    PYTHONPATH=. python examples/fused_conv_bn.py
"""
from __future__ import annotations

import math

import tracer as tr
import tracer.nn.functional as F
from tracer import nn


def convolution_backward(grad_out, X, weight):
    """The gradients of conv2d(X, weight) with respect to X and weight."""
    grad_input = F.conv2d(X.transpose(0, 1), grad_out.transpose(0, 1)).transpose(0, 1)
    grad_X = F.conv_transpose2d(grad_out, weight)
    return grad_X, grad_input


def unsqueeze_all(t):
    """A per-channel vector shaped to broadcast over (N, C, H, W)."""
    return t[None, :, None, None]


def batch_norm_backward(grad_out, X, sum, sqrt_var, N, eps):
    """The gradient of out = (X - mean(X)) / (sqrt(var(X)) + eps) (the unbiased variance per
    channel), written with as few full-size buffers as the tutorial's."""
    tmp = ((X - unsqueeze_all(sum) / N) * grad_out).sum(dim=(0, 2, 3))
    tmp *= -1
    d_denom = tmp / (sqrt_var + eps) ** 2  # d_denom = -num / denom**2
    d_var = d_denom / (2 * sqrt_var)  # denom = sqrt(var) + eps
    d_mean_dx = grad_out / unsqueeze_all(sqrt_var + eps)
    d_mean_dx = unsqueeze_all(-d_mean_dx.sum(dim=(0, 2, 3)) / N)
    grad_input = X * unsqueeze_all(d_var * N)  # (1) the variance
    grad_input += unsqueeze_all(-d_var * sum)
    grad_input *= 2 / ((N - 1) * N)
    grad_input += d_mean_dx  # (2) the mean
    grad_input *= unsqueeze_all(sqrt_var + eps)  # (3) X in the numerator
    grad_input += grad_out
    grad_input /= unsqueeze_all(sqrt_var + eps)
    return grad_input


class FusedConvBN2DFunction(tr.Function):
    @staticmethod
    def forward(ctx, X, conv_weight, eps=1e-3):
        assert X.ndim == 4  # N, C, H, W
        # (1) only the convolution's input and weight are saved for backward
        ctx.save_for_backward(X, conv_weight)
        # (2) the convolution
        X = F.conv2d(X, conv_weight)
        # (3) the batch norm
        sum = X.sum(dim=(0, 2, 3))
        var = X.var(unbiased=True, dim=(0, 2, 3))
        N = X.numel() / X.size(1)
        sqrt_var = tr.sqrt(var)
        ctx.eps = eps
        ctx.sum = sum
        ctx.N = N
        ctx.sqrt_var = sqrt_var
        mean = sum / N
        denom = sqrt_var + eps
        X.sub_(unsqueeze_all(mean))
        X.div_(unsqueeze_all(denom))
        return X

    @staticmethod
    def backward(ctx, grad_out):
        X, conv_weight, = ctx.saved_tensors
        # (4) the batch norm's backward, (5) on the recomputed convolution
        X_conv_out = F.conv2d(X, conv_weight)
        grad_out = batch_norm_backward(grad_out, X_conv_out, ctx.sum, ctx.sqrt_var, ctx.N,
                                       ctx.eps)
        # (6) the convolution's backward
        grad_X, grad_input = convolution_backward(grad_out, X, conv_weight)
        return grad_X, grad_input, None


class FusedConvBN(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, eps=1e-3, dtype=None):
        super().__init__()
        # the initialization of Conv2d's weight: uniform in +-1/sqrt(fan_in)
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        shape = (out_channels, in_channels, kernel_size, kernel_size)
        self.conv_weight = nn.Parameter((tr.rand(*shape, dtype=dtype or tr.float32) * 2 - 1)
                                        * bound)
        self.eps = eps

    def forward(self, X):
        return FusedConvBN2DFunction.apply(X, self.conv_weight, self.eps)


class Net(nn.Module):
    """The tutorial's network for 28x28 images (here any size >= 10), with the fused layer."""

    def __init__(self, fused=True, size=28):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.bn = FusedConvBN(32, 64, 3) if fused else None
        self.fc1 = nn.Linear(64 * ((size - 4) // 2) ** 2, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.bn(x))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.fc1(F.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def gradchecks() -> bool:
    """The tutorial's checks, in float64: the fused Function's gradients against finite
    differences."""
    tr.manual_seed(0)
    weight = tr.rand(5, 3, 3, 3, dtype=tr.float64, requires_grad=True)
    X = tr.rand(2, 3, 4, 4, dtype=tr.float64, requires_grad=True)
    return tr.gradcheck(FusedConvBN2DFunction.apply, (X, weight))


def train(steps: int = 10, size: int = 12, batch: int = 16, seed: int = 0) -> list[float]:
    """A few SGD steps of Net on random images, each one compiled call; the losses."""
    tr.manual_seed(seed)
    model = Net(size=size)
    optimizer = tr.optim.SGD(model.parameters(), lr=0.02)
    images = tr.randn(batch, 1, size, size)
    labels = (images.sum((1, 2, 3)) > 0).long() + 2 * (images[:, 0, 0, 0] > 0).long()

    @tr.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return [step(images, labels).item() for _ in range(steps)]


def main() -> None:
    print("gradcheck of FusedConvBN2DFunction:", gradchecks())
    losses = train()
    print("traced training, loss per step:", " ".join(f"{loss:.3f}" for loss in losses))


if __name__ == "__main__":
    main()
