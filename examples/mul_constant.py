"""The seed `mul_constant` Function, as R torch's vignette writes it: the constant (a plain
number) is saved by name with `ctx.save_for_backward(constant = constant)` and read back from
`ctx.saved_variables`; its gradient is None because it is not a tensor."""
import tracer as tr


def _forward(ctx, tensor, constant):
    ctx.save_for_backward(constant=constant)
    return tensor * constant


def _backward(ctx, grad_output):
    v = ctx.saved_variables
    return {"tensor": grad_output * v.constant}


mul_constant = tr.autograd_function(forward=_forward, backward=_backward, name="mul_constant")


def main() -> None:
    x = tr.tensor([1.0], requires_grad=True)
    o = mul_constant(x, 2)
    o.backward()
    print("x.grad =", x.grad)  # 2, as in the vignette


if __name__ == "__main__":
    main()
