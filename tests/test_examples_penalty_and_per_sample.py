"""The WGAN-GP critic step (examples/wgan_gp.py) and the per-sample gradient norms and clipped step
(examples/per_sample_grads.py), eagerly and compiled, against the same programs in PyTorch
(torch.func.vmap and torch.func.grad for the per-sample gradients)."""
import numpy as np
import pytest
import torch

import tracer as tr
import per_sample_grads
import wgan_gp


def torch_mlp(module, activation):
    """The example's MLP as a torch function of copies of its weights (leaves requiring grad)."""
    weights = [(torch.tensor(layer.weight.detach().numpy(), requires_grad=True),
                torch.tensor(layer.bias.detach().numpy(), requires_grad=True))
               for layer in module.layers]

    def forward(x):
        for index, (w, b) in enumerate(weights):
            x = x @ w.T + b
            if index < len(weights) - 1:
                x = activation(x)
        return x
    return forward, [t for pair in weights for t in pair]


def torch_critic_loss(critic, generator, real, noise, epsilon):
    fake = generator(noise).detach()
    interpolates = (epsilon * real + (1 - epsilon) * fake).requires_grad_()
    scores = critic(interpolates)
    (gradients,) = torch.autograd.grad(scores, interpolates, torch.ones_like(scores),
                                       create_graph=True, retain_graph=True)
    penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return critic(fake).mean() - critic(real).mean() + wgan_gp.PENALTY * penalty


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_wgan_gp_critic_steps_match_pytorch(traced):
    critic, generator = wgan_gp.models()
    torch_critic, critic_weights = torch_mlp(critic, torch.tanh)
    torch_generator, _ = torch_mlp(generator, torch.relu)
    optimizer = tr.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    torch_optimizer = torch.optim.Adam(critic_weights, lr=1e-4, betas=(0.0, 0.9))
    step = wgan_gp.make_step(critic, generator, optimizer, traced)
    for seed in range(3):
        data = wgan_gp.batch(32, seed=seed)
        loss = step(*data)
        torch_optimizer.zero_grad()
        expected = torch_critic_loss(torch_critic, torch_generator,
                                     *(torch.from_numpy(d.numpy().copy()) for d in data))
        expected.backward()
        torch_optimizer.step()
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-5)
    ours = [p.detach().numpy() for p in critic.parameters()]
    for a, b in zip(ours, critic_weights, strict=True):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-4, atol=1e-6)


def test_wgan_gp_penalty_gradient_is_a_double_backward_of_the_critic():
    # The penalty alone, at one point, against float64 finite differences of the weights'
    # gradient: a second derivative of the critic that tr.gradcheck checks.
    critic, _ = wgan_gp.models(hidden=4)
    critic.double()
    point = tr.tensor([[0.3, -0.7]], dtype=tr.float64)
    weight = critic.layers[0].weight

    def penalty(w):
        x = point.clone().requires_grad_()
        h = (x @ w.t() + critic.layers[0].bias).tanh()
        for layer in critic.layers[1:-1]:
            h = layer(h).tanh()
        (g,) = tr.autograd.grad(critic.layers[-1](h).sum(), x, create_graph=True)
        return ((g.norm(2, dim=1) - 1) ** 2).sum()

    assert tr.gradcheck(penalty, (weight.detach().clone().requires_grad_(),))


def torch_loss(params, x, y):
    h = (x @ params["w1"] + params["b1"]).tanh()
    logits = h @ params["w2"] + params["b2"]
    return torch.nn.functional.cross_entropy(logits.unsqueeze(0), y.unsqueeze(0))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_per_sample_gradient_norms_match_torch_func(traced):
    params = per_sample_grads.init()
    x, y = per_sample_grads.data(size=8)
    norms = (tr.trace(per_sample_grads.norms) if traced else per_sample_grads.norms)(params, x, y)
    torch_params = {k: torch.tensor(v.numpy()) for k, v in params.items()}
    grads = torch.func.vmap(torch.func.grad(torch_loss), in_dims=(None, 0, 0))(
        torch_params, torch.tensor(x.numpy()), torch.tensor(y.numpy()))
    expected = sum((g.reshape(g.shape[0], -1) ** 2).sum(dim=1) for g in grads.values()).sqrt()
    np.testing.assert_allclose(norms.numpy(), expected.numpy(), rtol=1e-5)
    assert norms.shape == (8,) and len(set(np.round(norms.numpy(), 4))) == 8  # one per sample


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_clipped_steps_match_torch_func(traced):
    params = per_sample_grads.init()
    torch_params = {k: torch.tensor(v.numpy()) for k, v in params.items()}
    step = tr.trace(per_sample_grads.clipped_step) if traced else per_sample_grads.clipped_step
    per_sample = torch.func.vmap(torch.func.grad(torch_loss), in_dims=(None, 0, 0))
    for seed in range(2):
        x, y = per_sample_grads.data(size=8, seed=seed)
        step(params, x, y)
        grads = per_sample(torch_params, torch.tensor(x.numpy()), torch.tensor(y.numpy()))
        total = sum((g.reshape(g.shape[0], -1) ** 2).sum(dim=1) for g in grads.values()).sqrt()
        scale = (per_sample_grads.CLIP / (total + 1e-6)).clamp(max=1.0)
        assert (scale < 1).any() and (scale == 1).any()  # both cases of the clip are reached
        for name, g in grads.items():
            torch_params[name] -= 0.1 * (g * scale.reshape(-1, *[1] * (g.ndim - 1))).mean(dim=0)
    for name, value in params.items():
        np.testing.assert_allclose(value.numpy(), torch_params[name].numpy(), rtol=1e-5,
                                   atol=1e-6)
