"""A small decoder-only transformer (GPT) trained on characters, written as PyTorch users write one.

Token and position embeddings, causal self-attention (the mask is `tr.tril` of ones, applied with
`masked_fill`), layer norm before attention and before the GELU MLP, and cross-entropy on the next
character; trained with AdamW. The whole training step -- forward, backward, the AdamW update and
`zero_grad` -- is one `@tr.trace`d function, so it runs as one compiled call; the same model and
step also run eagerly, and both print their loss and tokens per second.

The corpus is the Python Language Reference as Python itself ships it for `help()`: the module
`pydoc_data.topics` (about 465,000 characters of English prose and code). It is part of CPython's
standard library, so a fresh Python 3.11 has it with nothing to download.

    PYTHONPATH=. python examples/transformer.py            # 300 steps compiled, 20 eagerly
    PYTHONPATH=. python examples/transformer.py --quick    # a smaller model, 30 steps
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import tracer as tr
import tracer.nn.functional as F
from tracer import nn


@dataclass
class Config:
    vocab_size: int
    block_size: int = 32    # the longest context, in characters
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    # Attention by F.scaled_dot_product_attention(is_causal=True), as nanoGPT writes it where
    # PyTorch has it ("flash"), instead of the mask of ones and masked_fill written out below.
    flash: bool = False
    # Biases in the linear layers and layer norms, as GPT-2 has. Off by default (nanoGPT's
    # advice: a bit better and faster), and for a reason of numbers: the key projection's bias
    # adds the same q . b to a whole row of attention scores, which softmax ignores, so its
    # gradient is 0 up to rounding, and Adam divides that noise by its own size + eps: the bias
    # moves by noise-driven steps that differ between any two evaluations (compiled or not).
    bias: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # query, key and value at once
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.flash = config.n_head, config.n_embd, config.flash
        # 1 where a position may attend (itself and earlier positions), 0 above the diagonal
        size = config.block_size
        self.register_buffer("bias", tr.tril(tr.ones(size, size)).view(1, 1, size, size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # the heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        B, T = idx.size()
        assert T <= self.config.block_size, f"a context of {T} is longer than the block size"
        pos = tr.arange(T)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# The data -----------------------------------------------------------------------------------------
def corpus() -> str:
    """The Python Language Reference, as `help()` shows it: every topic, in a fixed order."""
    from pydoc_data.topics import topics
    return "\n".join(topics[name] for name in sorted(topics))


class Characters:
    """The text as int64 character codes, and the vocabulary (the characters it uses)."""

    def __init__(self, text: str):
        self.alphabet = sorted(set(text))
        self.code = {character: index for index, character in enumerate(self.alphabet)}
        self.data = tr.tensor([self.code[c] for c in text], dtype=tr.long)

    def decode(self, codes) -> str:
        return "".join(self.alphabet[int(c)] for c in codes)

    def batch(self, batch_size: int, block_size: int):
        """`batch_size` random windows of the text and, for each, the next character at each
        position: integer indexing picks them all at once."""
        starts = tr.randint(0, self.data.shape[0] - block_size, (batch_size,))
        positions = starts.unsqueeze(1) + tr.arange(block_size)
        return self.data[positions], self.data[positions + 1]


# Training -----------------------------------------------------------------------------------------
def make_step(model: GPT, optimizer):
    """One training step: the same code runs eagerly and, under tr.trace, as one compiled call that
    reads the parameters and AdamW's state from their objects and updates them in place."""
    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
    return step


def train(model: GPT, optimizer, batches, traced: bool, report=None) -> tuple[list[float], float]:
    """Run the step on each (x, y) in `batches`; the losses and the tokens per second (timed from
    the second step on: the first traces and compiles)."""
    step = make_step(model, optimizer)
    step = tr.trace(step) if traced else step
    losses, started = [], None
    for number, (x, y) in enumerate(batches, 1):
        losses.append(step(x, y).item())
        if number == 1:
            started = time.perf_counter()
        if report is not None:
            report(number, losses[-1])
    seconds = time.perf_counter() - started
    tokens = sum(x.numel() for x, _ in batches[1:])
    return losses, tokens / seconds if tokens else float("nan")


@tr.no_grad()
def generate(model: GPT, idx, new_tokens: int):
    """Continue each row of `idx` with the most likely next character, one at a time (eagerly)."""
    model.eval()
    for _ in range(new_tokens):
        logits, _ = model(idx[:, -model.config.block_size:])
        idx = tr.cat([idx, logits[:, -1, :].argmax(-1, keepdim=True)], dim=1)
    return idx


def main(argv=None) -> dict[str, tuple[list[float], float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="training steps (default 300, 30 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smaller model, 30 steps")
    parser.add_argument("--eager-steps", type=int, default=20,
                        help="how many of the same steps run eagerly, to compare (default 20)")
    parser.add_argument("--batch-size", type=int, default=16)
    options = parser.parse_args(argv)
    steps = options.steps or (30 if options.quick else 300)
    text = Characters(corpus())
    vocabulary = len(text.alphabet)
    config = (Config(vocabulary, block_size=16, n_layer=1, n_embd=32) if options.quick
              else Config(vocabulary))
    tr.manual_seed(0)
    batches = [text.batch(options.batch_size, config.block_size) for _ in range(steps)]
    print(f"corpus: {text.data.shape[0]:,} characters, {vocabulary} distinct; {steps} steps of "
          f"{options.batch_size}x{config.block_size} tokens, {config.n_layer} layers of width "
          f"{config.n_embd}")
    results, models = {}, {}
    for name, count in (("compiled", steps), ("eager", min(options.eager_steps, steps))):
        tr.manual_seed(1)  # the same initial weights for both runs
        model = models[name] = GPT(config)
        optimizer = tr.optim.AdamW(model.parameters(), lr=3e-3)
        every = max(steps // 10, 1)

        def report(number: int, loss: float, every=every, name=name) -> None:
            if number % every == 0 or number == 1:
                print(f"  {name:8} step {number:4}: loss {loss:.3f}")

        results[name] = train(model, optimizer, batches[:count], name == "compiled", report)
    (compiled, compiled_speed), (eager, eager_speed) = results["compiled"], results["eager"]
    print(f"compiled: loss {compiled[0]:.3f} -> {compiled[-1]:.3f} after {len(compiled)} steps, "
          f"{compiled_speed:,.0f} tokens/s (after the first step, which compiles)")
    print(f"eager:    loss {eager[0]:.3f} -> {eager[-1]:.3f} after {len(eager)} steps "
          f"(compiled: {compiled[len(eager) - 1]:.3f}), {eager_speed:,.0f} tokens/s")
    print(f"compiled / eager tokens per second: {compiled_speed / eager_speed:.1f}x")
    prompt = "The "
    sample = generate(models["compiled"], tr.tensor([[text.code[c] for c in prompt]]), 60)
    print(f"the compiled run's model continues {prompt!r} as {text.decode(sample[0])!r}")
    return results


if __name__ == "__main__":
    main()
