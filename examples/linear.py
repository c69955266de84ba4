"""The seed `linear` Function in both API styles, with an optional bias and needs_input_grad.

R torch's vignette writes it with `autograd_function(forward=, backward=)`, saving by name and
returning a list of gradients by name; PyTorch writes the same thing as a Function subclass.
"""
import tracer as tr

# R torch style: named saves, ctx.saved_variables.<name>, ctx.needs_input_grad.<name>, a dict back.
def _linear_forward(ctx, input, weight, bias=None):
    ctx.save_for_backward(input=input, weight=weight, bias=bias)
    output = input.mm(weight.t())
    if bias is not None:
        output = output + bias.unsqueeze(0).expand_as(output)
    return output


def _linear_backward(ctx, grad_output):
    s = ctx.saved_variables
    grads = {"input": None, "weight": None, "bias": None}
    if ctx.needs_input_grad.input:
        grads["input"] = grad_output.mm(s.weight)
    if ctx.needs_input_grad.weight:
        grads["weight"] = grad_output.t().mm(s.input)
    if s.bias is not None and ctx.needs_input_grad.bias:
        grads["bias"] = grad_output.sum(dim=0)
    return grads


linear = tr.autograd_function(forward=_linear_forward, backward=_linear_backward, name="linear")


# PyTorch style: the same function as a Function subclass.
class LinearFunction(tr.Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight, bias)
        output = input.mm(weight.t())
        if bias is not None:
            output += bias.unsqueeze(0).expand_as(output)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.mm(weight)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_output.t().mm(input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


def main() -> None:
    tr.manual_seed(0)
    x = tr.randn(5, 3, dtype=tr.float64, requires_grad=True)
    w = tr.randn(4, 3, dtype=tr.float64, requires_grad=True)
    b = tr.randn(4, dtype=tr.float64, requires_grad=True)
    for name, function in (("autograd_function", linear), ("Function", LinearFunction.apply)):
        print(name, "with bias:", tr.gradcheck(function, (x, w, b)),
              "without bias:", tr.gradcheck(function, (x, w)),
              "traced:", tr.gradcheck(tr.trace(function), (x, w, b)))


if __name__ == "__main__":
    main()
