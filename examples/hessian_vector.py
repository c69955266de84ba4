"""Hessian-vector products of an MLP's loss, without forming the Hessian: the gradient of
<gradient, v> (double backward), or tr.jvp of tr.grad (forward-over-reverse, here by transposing
the reverse pass). Used by Newton-CG and by curvature diagnostics; a few conjugate-gradient
iterations below solve H d = -g for a Newton step on a small regression."""
import numpy as np

import tracer as tr


def mlp_loss(w1, w2, x, y):
    return (((x @ w1).tanh() @ w2 - y) ** 2).mean()


def hvp(w1, w2, v1, v2, x, y):
    """H v for the loss's Hessian with respect to (w1, w2), by double backward."""
    g1, g2 = tr.autograd.grad(mlp_loss(w1, w2, x, y), [w1, w2], create_graph=True)
    return tr.autograd.grad((g1 * v1).sum() + (g2 * v2).sum(), [w1, w2])


def hvp_forward_over_reverse(w1, w2, v1, v2, x, y):
    """The same product as tr.jvp of tr.grad."""
    gradient = tr.grad(mlp_loss, argnums=(0, 1))
    return tr.jvp(lambda a, b: gradient(a, b, x, y), (w1, w2), (v1, v2))[1]


def newton_cg_step(w1, w2, x, y, iterations: int = 10):
    """One Newton step, H d = -g solved by conjugate gradients from H-vector products alone."""
    product = tr.trace(hvp)
    g1, g2 = tr.grad(mlp_loss, argnums=(0, 1))(w1, w2, x, y)
    d1, d2 = tr.zeros_like(w1), tr.zeros_like(w2)
    r1, r2 = -g1, -g2
    p1, p2 = r1.clone(), r2.clone()
    rr = (r1 * r1).sum() + (r2 * r2).sum()
    for _ in range(iterations):
        h1, h2 = product(w1.detach().requires_grad_(), w2.detach().requires_grad_(), p1, p2, x, y)
        alpha = rr / ((p1 * h1).sum() + (p2 * h2).sum())
        d1, d2 = d1 + alpha * p1, d2 + alpha * p2
        r1, r2 = r1 - alpha * h1, r2 - alpha * h2
        new_rr = (r1 * r1).sum() + (r2 * r2).sum()
        p1, p2 = r1 + new_rr / rr * p1, r2 + new_rr / rr * p2
        rr = new_rr
    return w1 + d1, w2 + d2


def problem(seed: int = 0):
    random = np.random.default_rng(seed)
    x = random.standard_normal((64, 3))
    y = np.sin(x @ np.array([[1.0], [-2.0], [0.5]]))
    w1 = random.standard_normal((3, 8)) * 0.5
    w2 = random.standard_normal((8, 1)) * 0.5
    return [tr.tensor(a) for a in (w1, w2, x, y)]


def main() -> None:
    w1, w2, x, y = problem()
    print(f"loss before: {mlp_loss(w1, w2, x, y).item():.5f}")
    for _ in range(3):
        w1, w2 = newton_cg_step(w1, w2, x, y)
        print(f"after a Newton-CG step: {mlp_loss(w1, w2, x, y).item():.5f}")


if __name__ == "__main__":
    main()
