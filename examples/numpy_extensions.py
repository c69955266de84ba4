"""PyTorch's tutorial "Creating extensions using numpy and scipy", with `torch` renamed `tr`: a
Function computing in numpy.fft and one computing in scipy.signal, each inside a traced training
step with parameters. Under `@tr.trace` each Function's forward and backward run as host
callbacks: the compiled step calls back into Python for them, and the rest of the step (the
loss, its gradient, the optimizer's update) is compiled and fused around them.

SciPy is not a dependency of tracer: where it is not installed, `correlate2d` and `convolve2d`
below are numpy's sliding windows (the same sums, for the "valid" and "full" modes used here).
"""
import numpy as np
from numpy.fft import rfft2, irfft2

import tracer as tr
from tracer.autograd import Function
from tracer.nn import Module, Parameter

try:
    from scipy.signal import convolve2d, correlate2d
except ImportError:  # numpy's windows in place of scipy.signal's two functions
    def correlate2d(in1, in2, mode="full"):
        if mode == "full":
            rows, columns = in2.shape[0] - 1, in2.shape[1] - 1
            in1 = np.pad(in1, ((rows, rows), (columns, columns)))
        windows = np.lib.stride_tricks.sliding_window_view(in1, in2.shape)
        return np.einsum("ijkl,kl->ij", windows, in2)

    def convolve2d(in1, in2, mode="full"):
        return correlate2d(in1, in2[::-1, ::-1], mode)


# The parameter-less example: an FFT's magnitudes, with a "bad" (not the true) gradient.
class BadFFTFunction(Function):
    @staticmethod
    def forward(ctx, input):
        numpy_input = input.detach().numpy()
        result = abs(rfft2(numpy_input))
        return input.new(result)

    @staticmethod
    def backward(ctx, grad_output):
        numpy_go = grad_output.numpy()
        result = irfft2(numpy_go)
        return grad_output.new(result)


def incorrect_fft(input):
    return BadFFTFunction.apply(input)


# The example with learnable weights: a cross-correlation in scipy.
class ScipyConv2dFunction(Function):
    @staticmethod
    def forward(ctx, input, filter, bias):
        # detach so we can cast to NumPy
        input, filter, bias = input.detach(), filter.detach(), bias.detach()
        result = correlate2d(input.numpy(), filter.numpy(), mode='valid')
        result += bias.numpy()
        ctx.save_for_backward(input, filter, bias)
        return tr.as_tensor(result, dtype=input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        grad_output = grad_output.detach()
        input, filter, bias = ctx.saved_tensors
        grad_output = grad_output.numpy()
        grad_bias = np.sum(grad_output, keepdims=True)
        grad_input = convolve2d(grad_output, filter.numpy(), mode='full')
        # the previous line can be expressed equivalently as:
        # grad_input = correlate2d(grad_output, flip(flip(filter.numpy(), axis=0), axis=1), mode='full')
        grad_filter = correlate2d(input.numpy(), grad_output, mode='valid')
        return tr.from_numpy(grad_input), tr.from_numpy(grad_filter).to(tr.float), tr.from_numpy(grad_bias).to(tr.float)


class ScipyConv2d(Module):
    def __init__(self, filter_width, filter_height):
        super(ScipyConv2d, self).__init__()
        self.filter = Parameter(tr.randn(filter_width, filter_height))
        self.bias = Parameter(tr.randn(1, 1))

    def forward(self, input):
        return ScipyConv2dFunction.apply(input, self.filter, self.bias)


# Training steps with parameters around each Function, compiled whole with @tr.trace.
class SpectrumModel(Module):
    """A learnable mask on an image, the FFT magnitudes of the masked image, then a linear map."""

    def __init__(self, size: int):
        super().__init__()
        self.mask = Parameter(tr.randn(size, size) * 0.5)
        self.readout = Parameter(tr.randn(size // 2 + 1) * 0.1)

    def forward(self, image):
        spectrum = incorrect_fft(image * self.mask.tanh())
        return (spectrum + 1).log() @ self.readout


def training_step(model: Module, optimizer, image, target):
    """One step: the squared error of the model's output, its gradient, the optimizer's update."""
    optimizer.zero_grad()
    loss = ((model(image) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss


def train(model: Module, optimizer, batches, traced: bool = True) -> list[float]:
    step = tr.trace(training_step) if traced else training_step
    return [float(step(model, optimizer, image, target)) for image, target in batches]


def batches(count: int, size: int, seed: int = 0):
    random = np.random.default_rng(seed)
    return [(tr.tensor(random.standard_normal((size, size)), dtype=tr.float32),
             tr.tensor(random.standard_normal(size), dtype=tr.float32)) for _ in range(count)]


def conv_batches(count: int, size: int, filter_size: int = 3, seed: int = 0):
    random = np.random.default_rng(seed)
    out = size - filter_size + 1
    return [(tr.tensor(random.standard_normal((size, size)), dtype=tr.float32),
             tr.tensor(random.standard_normal((out, out)), dtype=tr.float32))
            for _ in range(count)]


if __name__ == "__main__":
    tr.manual_seed(0)
    model = SpectrumModel(8)
    losses = train(model, tr.optim.Adam(model.parameters(), lr=0.05), batches(20, 8))
    print("FFT model losses:", [round(v, 4) for v in losses[::5]])
    tr.manual_seed(0)
    conv = ScipyConv2d(3, 3)
    losses = train(conv, tr.optim.SGD(conv.parameters(), lr=0.01), conv_batches(20, 10))
    print("SciPy convolution losses:", [round(v, 4) for v in losses[::5]])
