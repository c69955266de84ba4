"""The seed program: a two-layer network with a custom ReLU, trained by SGD for 500 steps.

R torch's port of the PyTorch tutorial (N=64, D_in=1000, H=100, D_out=10, lr=1e-6), with the whole
training step -- forward, backward through the custom Function, in-place update -- under @tr.trace.
Prints the seed's loss lines, then the time per step of the traced step against eager mode.
"""
import time

import tracer as tr


class MyReLU(tr.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return input.clamp(min=0)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input < 0] = 0
        return grad_input


def step(x, y, w1, w2, learning_rate):
    y_pred = MyReLU.apply(x.mm(w1)).mm(w2)
    loss = (y_pred - y).pow(2).sum()
    loss.backward()
    with tr.no_grad():
        w1.sub_(learning_rate * w1.grad)
        w2.sub_(learning_rate * w2.grad)
        w1.grad.zero_()
        w2.grad.zero_()
    return loss


def make_data(seed: int = 0, N: int = 64, D_in: int = 1000, H: int = 100, D_out: int = 10):
    tr.manual_seed(seed)
    x = tr.randn(N, D_in)
    y = tr.randn(N, D_out)
    w1 = tr.randn(D_in, H, requires_grad=True)
    w2 = tr.randn(H, D_out, requires_grad=True)
    return x, y, w1, w2


def train(step_function, steps: int = 500, learning_rate: float = 1e-6, report=print):
    x, y, w1, w2 = make_data()
    losses = []
    for t in range(1, steps + 1):
        loss = step_function(x, y, w1, w2, learning_rate)
        losses.append(loss.item())
        if t % 100 == 0 or t == 1:
            report(f"Step: {t} : {loss.item():.7g}")
    return losses


def time_per_step(step_function, repeats: int = 50) -> float:
    x, y, w1, w2 = make_data()
    step_function(x, y, w1, w2, 1e-6)  # compile (traced) or warm up (eager)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step_function(x, y, w1, w2, 1e-6)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    traced_step = tr.trace(step)
    print("Training the seed two-layer network, the whole step under @tr.trace:")
    train(traced_step)
    eager = time_per_step(step)
    traced = time_per_step(traced_step)
    print(f"median time per step: traced {traced * 1e3:.3f} ms, eager {eager * 1e3:.3f} ms "
          f"(eager / traced = {eager / traced:.2f}x)")


if __name__ == "__main__":
    main()
