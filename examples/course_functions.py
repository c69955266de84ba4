"""The EE-559 course's Functions: KillHead (clone and slice assignment, returns (grad, None)) and
Something, |uv| with sign/abs, both checked by gradcheck in float64, eagerly and traced."""
import tracer as tr


class KillHead(tr.Function):
    @staticmethod
    def forward(ctx, input, n):
        ctx.n = n
        result = input.clone()
        result[:, 0:ctx.n] = 0
        return result

    @staticmethod
    def backward(ctx, grad_output):
        result = grad_output.clone()
        result[:, 0:ctx.n] = 0
        return result, None


killhead = KillHead.apply


class Something(tr.Function):
    @staticmethod
    def forward(ctx, input1, input2):
        ctx.save_for_backward(input1, input2)
        return (input1 * input2).abs()

    @staticmethod
    def backward(ctx, grad_output):
        input1, input2 = ctx.saved_variables
        return grad_output * input1.sign() * input2.abs(), \
            grad_output * input1.abs() * input2.sign()


something = Something.apply


def mse_loss(prediction, target):
    return ((prediction - target) ** 2).mean()


def killhead_training(steps: int = 5, eta: float = 1.0, report=print) -> list[float]:
    """The course's loop: minimize the MSE of killhead(x, 2) against y by gradient descent on x."""
    tr.manual_seed(0)
    y = tr.randn(3, 8)
    x = tr.randn(3, 8).requires_grad_()
    losses = []
    for k in range(steps):
        r = killhead(x, 2)
        loss = mse_loss(r, y)
        if k > 0:
            x.grad.zero_()
        loss.backward()
        report(k, loss.item())
        losses.append(loss.item())
        with tr.no_grad():
            x.sub_(eta * x.grad)
    return losses


def main() -> None:
    killhead_training()
    x = (tr.rand(10, 20, dtype=tr.float64) * 2 - 1).requires_grad_()
    if tr.gradcheck(killhead, (x, 4), eps=1e-6, atol=1e-4):
        print("All good captain.")
    u = tr.randn(4, 5, dtype=tr.float64, requires_grad=True)
    v = tr.randn(4, 5, dtype=tr.float64, requires_grad=True)
    print("|uv| gradcheck:", tr.gradcheck(something, (u, v)),
          "traced:", tr.gradcheck(tr.trace(something), (u, v)))


if __name__ == "__main__":
    main()
