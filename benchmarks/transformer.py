"""The training step of examples/transformer.py: a small GPT (token and position embeddings,
causal self-attention, layer norm, GELU MLP, cross-entropy on the next character) with AdamW's
update, `loss.backward(); optimizer.step(); optimizer.zero_grad()` in one step. The tracer runs the
example's own model and step; PyTorch runs the same model written with torch.nn (`torch_gpt()`,
also the oracle of tests/test_examples_transformer.py), from the same initial weights on the same
batch, eagerly and under torch.compile; jax.jit runs it written with jax.numpy (`jax_gpt()`), its
gradient by `jax.value_and_grad` and AdamW's update as a pure function. No numpy version: writing
the backward of a transformer by hand is not what its users do.

The float64 reference is the tracer's eager mode in float64 (numpy, the reference semantics, which
tests/test_examples_transformer.py checks against PyTorch to 1e-12).
"""
from __future__ import annotations

import functools
import math

from benchmarks import floors
from benchmarks.harness import CALLS_BEFORE_CHECK, Program, Row, Timing, load_example, measure
from benchmarks.jax_training import adam_state, adamw, cross_entropy
from benchmarks.peers import installed, jax_programs, torch_programs

# (batch, block_size, n_layer, n_head, n_embd): the example's default model, and GPTs of head size
# 32 and 64 with contexts of 64 to 256 characters (the first is issue 15's).
SIZES = {"16×32 tokens, 2 layers × 64": (16, 32, 2, 4, 64),
         "16×128 tokens, 4 layers × 192 (6 heads of 32)": (16, 128, 4, 6, 192),
         "32×64 tokens, 4 layers × 256 (4 heads of 64)": (32, 64, 4, 4, 256),
         "8×256 tokens, 4 layers × 128 (2 heads of 64)": (8, 256, 4, 2, 128),
         # nanoGPT's attention where PyTorch has it: F.scaled_dot_product_attention(is_causal=True)
         "16×128 tokens, 4 layers × 192, scaled_dot_product_attention": (16, 128, 4, 6, 192, True)}
QUICK_SIZES = ("16×32 tokens, 2 layers × 64",)
# The sizes of the second row, the model compiled as torch.compile users compile one (the loss's
# backward and the optimizer's step run eagerly around it): the quick size and issue 15's.
MODEL_SIZES = ("16×32 tokens, 2 layers × 64", "16×128 tokens, 4 layers × 192 (6 heads of 32)")
LEARNING_RATE = 3e-3
# The loss of the second step, which every gradient of the first feeds through its update: sums
# of up to 4 * n_embd float32 products per value, typical error sqrt(K) u of the scale; 1e-4.
TOLERANCE = 1e-4
# The parameters: Adam's first steps are about lr * g / (|g| + eps), nearly lr * sign(g) where
# |g| >> eps (insensitive to the gradient's rounding), but an element whose gradient is within
# float32's rounding of 0 (an error of ~1e-9 against eps = 1e-8) moves by up to ~0.1 lr
# differently in any two evaluations (a few elements of 100,000 do, by up to 0.005 lr). So the
# parameters are checked to 0.1 lr per step: TOLERANCE times this scale.
PARAMETER_SCALE = 0.1 * LEARNING_RATE * CALLS_BEFORE_CHECK / TOLERANCE


@functools.cache
def example():
    """examples/transformer.py, loaded from its file."""
    return load_example("transformer.py")


@functools.cache
def characters():
    """The example's corpus as character codes."""
    return example().Characters(example().corpus())


def config(size):
    batch, block_size, layers, heads, width, *flash = size
    vocabulary = len(characters().alphabet)
    return example().Config(vocabulary, block_size=block_size, n_layer=layers, n_head=heads,
                            n_embd=width, flash=bool(flash and flash[0]))


def make_inputs(size, seed: int = 0):
    """The model's configuration, its initial weights (float32 numpy arrays by name) and one
    batch of the corpus (inputs and next characters, int64)."""
    import tracer as tr
    transformer = example()
    settings = config(size)
    tr.manual_seed(seed)
    x, y = characters().batch(size[0], settings.block_size)
    model = transformer.GPT(settings)
    weights = {name: value.numpy().copy() for name, value in model.state_dict().items()}
    return settings, weights, (x.numpy().copy(), y.numpy().copy())


def reference(inputs):
    """The loss of the last of CALLS_BEFORE_CHECK steps and the parameters after them, in
    float64 (eager), with the scales of the check."""
    import tracer as tr
    settings, weights, (x, y) = inputs
    model = example().GPT(settings).double()
    model.load_state_dict(weights)
    step = example().make_step(model, tr.optim.AdamW(model.parameters(), lr=LEARNING_RATE))
    for _ in range(CALLS_BEFORE_CHECK):
        loss = step(tr.tensor(x), tr.tensor(y))
    expected = [loss.detach().numpy()] + [p.detach().numpy() for p in model.parameters()]
    return expected, [abs(float(loss))] + [PARAMETER_SCALE] * (len(expected) - 1)


def tracer_program(inputs) -> Program:
    import tracer as tr
    settings, weights, (x, y) = inputs

    def build():
        model = example().GPT(settings)
        model.load_state_dict(weights)
        optimizer = tr.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        step = tr.trace(example().make_step(model, optimizer))
        tokens, targets = tr.tensor(x), tr.tensor(y)

        def run():
            return (step(tokens, targets), *model.parameters())
        run.traced = step  # for benchmarks/kernel_profile.py
        return run
    return Program("tracer", build)


def tracer_model_program(inputs) -> Program:
    """`tr.trace(model)`, as `torch.compile(model)`: the forward compiled, its backward (split
    from it: ir/partition.py), the eager `loss.backward()` and AdamW's eager step around it."""
    import tracer as tr
    settings, weights, (x, y) = inputs

    def build():
        model = example().GPT(settings)
        model.load_state_dict(weights)
        optimizer = tr.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        forward = tr.trace(model)
        tokens, targets = tr.tensor(x), tr.tensor(y)

        def run():
            _, loss = forward(tokens, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return (loss.detach(), *model.parameters())
        return run
    return Program("tracer", build)


@functools.cache
def torch_gpt():
    """The example's GPT written with torch.nn, parameter for parameter (the same names)."""
    torch = installed("torch")
    nn = torch.nn

    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
            self.n_head, self.n_embd, self.flash = config.n_head, config.n_embd, config.flash
            size = config.block_size
            self.register_buffer("bias", torch.tril(torch.ones(size, size)).view(1, 1, size, size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            if self.flash:
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                y = torch.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

        def forward(self, x):
            return self.c_proj(nn.functional.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.attn = CausalSelfAttention(config)
            self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.wte = nn.Embedding(config.vocab_size, config.n_embd)
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
            self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
            self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)),
                                               targets.view(-1))
    return GPT


@functools.cache
def jax_gpt():
    """The example's GPT as JAX users write one: its loss as a function of a dict of parameters
    (by the example's names) and a batch, with jax.numpy; the configuration picks the shapes."""
    jax = installed("jax")
    jnp = jax.numpy

    def linear(params, name, x):
        y = x @ params[f"{name}.weight"].T
        return y + params[f"{name}.bias"] if f"{name}.bias" in params else y

    def layer_norm(params, name, x):
        mean = x.mean(axis=-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        y = (x - mean) / jnp.sqrt(variance + 1e-5) * params[f"{name}.weight"]
        return y + params[f"{name}.bias"] if f"{name}.bias" in params else y

    def attention(params, name, x, heads):
        B, T, C = x.shape
        q, k, v = (a.reshape(B, T, heads, C // heads).transpose(0, 2, 1, 3)
                   for a in jnp.split(linear(params, f"{name}.c_attn", x), 3, axis=2))
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // heads))
        att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
        y = jax.nn.softmax(att, axis=-1) @ v
        return linear(params, f"{name}.c_proj", y.transpose(0, 2, 1, 3).reshape(B, T, C))

    def gpt_loss(params, idx, targets, config):
        x = params["wte.weight"][idx] + params["wpe.weight"][:idx.shape[1]]
        for layer in range(config.n_layer):
            block = f"h.{layer}"
            x = x + attention(params, f"{block}.attn", layer_norm(params, f"{block}.ln_1", x),
                              config.n_head)
            hidden = linear(params, f"{block}.mlp.c_fc", layer_norm(params, f"{block}.ln_2", x))
            x = x + linear(params, f"{block}.mlp.c_proj", jax.nn.gelu(hidden, approximate=False))
        return cross_entropy(linear(params, "lm_head", layer_norm(params, "ln_f", x)), targets)
    return gpt_loss


def torch_step(model, optimizer, x, y):
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def torch_transformer_programs(inputs) -> list[Program]:
    torch = installed("torch")
    if torch is None:
        return []
    settings, weights, (x, y) = inputs

    def build(function):
        model = torch_gpt()(settings)
        model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        tokens, targets = torch.from_numpy(x), torch.from_numpy(y)
        return lambda: (function(model, optimizer, tokens, targets), *model.parameters())
    return torch_programs(torch_step, build)


def torch_model_programs(inputs) -> list[Program]:
    """torch eager, and `torch.compile(model)` in the same eager step."""
    torch = installed("torch")
    if torch is None:
        return []
    settings, weights, (x, y) = inputs

    def build(compiled: bool):
        model = torch_gpt()(settings)
        model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        forward = torch.compile(model) if compiled else model
        tokens, targets = torch.from_numpy(x), torch.from_numpy(y)
        return lambda: (torch_step(forward, optimizer, tokens, targets), *model.parameters())
    return [Program("torch eager", lambda: build(False)),
            Program("torch.compile", lambda: build(True))]


def jax_transformer_programs(inputs) -> list[Program]:
    settings, weights, (x, y) = inputs
    # the parameters, in the tracer's order (not the attention mask)
    names = [name for name, _ in example().GPT(settings).named_parameters()]

    def step(params, optimizer_state, idx, targets):
        loss, grads = installed("jax").value_and_grad(jax_gpt())(params, idx, targets, settings)
        params, optimizer_state = adamw(params, grads, optimizer_state, LEARNING_RATE)
        return loss, params, optimizer_state

    def build(function):  # (jax is imported here, when the program is built: peers.jax_programs)
        jnp = installed("jax").numpy
        params = {name: jnp.asarray(weights[name]) for name in names}
        optimizer_state = adam_state(params)
        tokens, targets = jnp.asarray(x), jnp.asarray(y)

        def run():
            nonlocal params, optimizer_state
            loss, params, optimizer_state = function(params, optimizer_state, tokens, targets)
            return (loss.block_until_ready(), *(params[name] for name in names))
        return run
    return jax_programs(step, build, donate_argnums=(0, 1))


def matmul_shapes(settings, batch: int) -> list[tuple[int, ...]]:
    """(m, k, n) of the step's products, and (batch, m, k, n) of attention's batched ones, forward
    and backward (two per forward product)."""
    rows, width, block = batch * settings.block_size, settings.n_embd, settings.block_size
    heads = batch * settings.n_head
    size = width // settings.n_head
    forward = [(rows, width, 3 * width), (heads, block, size, block), (heads, block, block, size),
               (rows, width, width), (rows, width, 4 * width), (rows, 4 * width, width)]
    forward = forward * settings.n_layer + [(rows, width, settings.vocab_size)]
    return forward + [(*b, m, n, k) for *b, m, k, n in forward] + [
        (*b, k, m, n) for *b, m, k, n in forward]


def profiles(quick: bool) -> list[str]:
    """The per-kernel profile of the tracer's step at each size (benchmarks/kernel_profile.py)."""
    from benchmarks.kernel_profile import profile_text
    return [profile_text(f"GPT step {label}", tracer_program(make_inputs(SIZES[label])).build)
            for label in (QUICK_SIZES if quick else SIZES)]


def rows(quick: bool, timing: Timing) -> list[Row]:
    result = []
    for label in QUICK_SIZES if quick else SIZES:
        inputs = make_inputs(SIZES[label])
        expected, scales = reference(inputs)
        settings = inputs[0]
        tokens = SIZES[label][0] * settings.block_size
        row = measure(Row("transformer training step (AdamW)", label),
                      [tracer_program(inputs), *torch_transformer_programs(inputs),
                       *jax_transformer_programs(inputs)], expected,
                      TOLERANCE, timing, scales,
                      floors=floors.sgemm(matmul_shapes(settings, SIZES[label][0])))
        if "tracer" in row.seconds:
            row.size += f" ({tokens / row.seconds['tracer']:,.0f} tokens/s tracer)"
        result.append(row)
        if label in MODEL_SIZES:
            result.append(measure(
                Row("transformer training step, model compiled (AdamW)", label),
                [tracer_model_program(inputs), *torch_model_programs(inputs)], expected,
                TOLERANCE, timing, scales,
                floors=floors.sgemm(matmul_shapes(settings, SIZES[label][0]))))
    return result
