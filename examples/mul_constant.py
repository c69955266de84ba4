"""The seed `mul_constant` Function: parametrized by a non-tensor argument whose gradient is None."""
import tracer as tr

mul_constant = tr.autograd_function(
    forward=lambda ctx, tensor, constant: _forward(ctx, tensor, constant),
    backward=lambda ctx, grad_output: {"tensor": grad_output * ctx.constant},
    name="mul_constant",
)


def _forward(ctx, tensor, constant):
    ctx.constant = constant
    return tensor * constant


def main() -> None:
    x = tr.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    y = mul_constant(x, 2.0)
    y.sum().backward()
    print("x.grad =", x.grad)  # 2 everywhere


if __name__ == "__main__":
    main()
