"""A WGAN-GP critic step (Gulrajani et al., "Improved Training of Wasserstein GANs", 2017) on a
mixture of Gaussians: the critic's loss D(fake) - D(real) plus the gradient penalty
lambda * (||grad_x D(x_hat)|| - 1)^2 at random interpolates x_hat of real and generated samples.

The penalty differentiates the critic with respect to its input inside the loss
(`tr.autograd.grad(..., create_graph=True)`), and the loss is differentiated again with respect to
the critic's weights: a double backward. Under `@tr.trace` the whole Adam step is one compiled
native call (torch.compile does not compile a double backward).
"""
import numpy as np

import tracer as tr

PENALTY = 10.0  # lambda, the paper's


class MLP(tr.nn.Module):
    def __init__(self, sizes: list[int], activation):
        super().__init__()
        self.layers = tr.nn.ModuleList([tr.nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])
        self.activation = activation

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


def critic_loss(critic, generator, real, noise, epsilon):
    """The critic's WGAN-GP loss on a batch: real samples, the generator's noise, and the
    interpolation weights epsilon (one per sample, in [0, 1])."""
    fake = generator(noise).detach()
    interpolates = (epsilon * real + (1 - epsilon) * fake).requires_grad_()
    scores = critic(interpolates)
    (gradients,) = tr.autograd.grad(scores, interpolates, grad_outputs=tr.ones_like(scores),
                                    create_graph=True, retain_graph=True)
    penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return critic(fake).mean() - critic(real).mean() + PENALTY * penalty


def make_step(critic, generator, optimizer, traced: bool = True):
    def step(real, noise, epsilon):
        optimizer.zero_grad()
        loss = critic_loss(critic, generator, real, noise, epsilon)
        loss.backward()
        optimizer.step()
        return loss
    return tr.trace(step) if traced else step


def models(features: int = 2, hidden: int = 64, latent: int = 8, seed: int = 0):
    tr.manual_seed(seed)
    critic = MLP([features, hidden, hidden, 1], tr.tanh)
    generator = MLP([latent, hidden, features], tr.relu)
    return critic, generator


def batch(size: int, latent: int = 8, seed: int = 0):
    """Real samples from eight Gaussians on a circle, the generator's noise, and epsilon."""
    random = np.random.default_rng(seed)
    angles = random.integers(0, 8, size) * np.pi / 4
    real = np.stack([np.cos(angles), np.sin(angles)], 1) * 2 + random.normal(0, 0.02, (size, 2))
    noise = random.standard_normal((size, latent))
    epsilon = random.uniform(0, 1, (size, 1))
    return [tr.tensor(a, dtype=tr.float32) for a in (real, noise, epsilon)]


def train(steps: int, traced: bool = True, size: int = 64) -> list[float]:
    critic, generator = models()
    optimizer = tr.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    step = make_step(critic, generator, optimizer, traced)
    return [step(*batch(size, seed=n)).item() for n in range(steps)]


if __name__ == "__main__":
    losses = train(50)
    print("critic loss:", [round(v, 3) for v in losses[::10]])
