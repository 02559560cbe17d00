"""The PyTorch models, data and training step of torch_peers.py (CPU) and torch_cuda_peers.py.

Import after the caller has set its environment (threads, CUDA_VISIBLE_DEVICES): this imports
torch.

The cases follow encore_bench's: bench/mlp_step.h and bench/cnn_bench.cc (MlpSmall, MlpLarge,
SeedCnn), bench/sequence_step.h (CharLstm, TinyGpt, LstmCellChain).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# bench/sequence_step.h
CHAR_VOCAB = 96
CHAR_LSTM = dict(batch=32, steps=35, embed=64, hidden=256)
TINY_GPT = dict(batch=16, context=64, width=128, heads=4, blocks=2)
CHAIN = dict(hidden=64, steps=35)


def mlp(hidden):
    return nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


class SeedCnn(nn.Module):
    """Chainer's MNISTCONV (the static-subgraph reference): 3 convs 3x3 pad 1, relu, pool, linear."""

    def __init__(self, ch=8):
        super().__init__()
        self.c1 = nn.Conv2d(1, ch, 3, padding=1)
        self.c2 = nn.Conv2d(ch, ch, 3, padding=1)
        self.c3 = nn.Conv2d(ch, ch, 3, padding=1)
        self.l1 = nn.Linear(14 * 14 * ch, 10)

    def forward(self, x):
        h = self.c3(self.c2(self.c1(x)))
        h = F.max_pool2d(F.relu(h), 2)
        return self.l1(h.flatten(1))


class CharLstm(nn.Module):
    """encore's models::CharLstm: embedding, one-layer LSTM (batch_first), linear to logits."""

    def __init__(self, vocab=CHAR_VOCAB, embed=64, hidden=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):  # [B, T] -> [B, T, vocab]; h0, c0 zeros
        y, _ = self.lstm(self.embed(tokens))
        return self.head(y)


class CausalSelfAttention(nn.Module):
    """encore's nn::MultiheadAttention with causal self-attention, as torch.nn.MultiheadAttention
    (batch_first, no dropout): one packed q/k/v projection in_proj [3 width, width],
    F.scaled_dot_product_attention(is_causal=True) per head, out_proj."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        bound = math.sqrt(6.0 / (4 * width))  # xavier uniform of [3 width, width], as PyTorch's
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width).uniform_(-bound, bound))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * width))
        self.out_proj = nn.Linear(width, width)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x):  # [B, T, width]
        b, t, e = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).split(e, dim=2)
        split = lambda z: z.view(b, t, self.heads, e // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, e))


class TransformerBlock(nn.Module):
    """encore's nn::TransformerBlock (GPT-2's pre-norm block): x + attn(ln1(x)), then
    + fc2(gelu_tanh(fc1(ln2(x)))) with a 4 x width MLP."""

    def __init__(self, width, heads, mlp_ratio=4):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, mlp_ratio * width)
        self.fc2 = nn.Linear(mlp_ratio * width, width)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))


class TinyGpt(nn.Module):
    """encore's models::TinyGpt: token and learned position embeddings, pre-norm blocks, a final
    LayerNorm and a linear head (with bias). tokens [B, T], T <= context -> [B, T, vocab]."""

    def __init__(self, vocab=CHAR_VOCAB, context=64, width=128, heads=4, blocks=2):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(TransformerBlock(width, heads) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        h = self.token(tokens) + self.position.weight[: tokens.size(1)]  # first T rows, broadcast
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class CellChain(nn.Module):
    """LstmCellChain: one nn.LSTMCell stepped over xs [steps, 1, input] from zero h and c (made
    once, as encore's CellChain does); returns the last h."""

    def __init__(self, hidden=64):
        super().__init__()
        self.cell = nn.LSTMCell(hidden, hidden)
        self.register_buffer("h0", torch.zeros(1, hidden), persistent=False)
        self.register_buffer("c0", torch.zeros(1, hidden), persistent=False)

    def forward(self, xs):
        h, c = self.h0, self.c0
        for x in xs.unbind(0):
            h, c = self.cell(x, (h, c))
        return h


def token_batch(batch, steps, vocab=CHAR_VOCAB):
    """bench/sequence_step.h's token_batch: ids (i * 31 + 7) % vocab over the flattened
    [batch, steps] int64, and their next ids as targets."""
    i = torch.arange(batch * steps, dtype=torch.int64)
    x, t = (i * 31 + 7) % vocab, ((i + 1) * 31 + 7) % vocab
    return x.view(batch, steps), t.view(batch, steps)


def make_case(case, device="cpu", **adam_options):
    """(model, optimizer, x, labels) with fixed data, on `device`.

    The model and data are made on the CPU with seed 0 and then moved, so every device trains
    the same weights on the same data. `adam_options` go to torch.optim.Adam / AdamW (the MLP,
    CharLstm and TinyGpt cases). LstmCellChain has no optimizer (None) and no labels (None): x is
    its inputs [35, 1, 64] (randn), and its loss the sum of the last h.
    """
    torch.manual_seed(0)
    labels = None
    if case == "MlpSmall":
        model, batch, shape = mlp(100), 32, (784,)
    elif case == "MlpLarge":
        model, batch, shape = mlp(1000), 100, (784,)
    elif case == "SeedCnn":
        model, batch, shape = SeedCnn(), 32, (1, 28, 28)
    elif case == "CharLstm":
        c = CHAR_LSTM
        model = CharLstm(CHAR_VOCAB, c["embed"], c["hidden"])
        x, labels = token_batch(c["batch"], c["steps"])
    elif case == "TinyGpt":
        c = TINY_GPT
        model = TinyGpt(CHAR_VOCAB, c["context"], c["width"], c["heads"], c["blocks"])
        x, labels = token_batch(c["batch"], c["context"])
    elif case == "LstmCellChain":
        model = CellChain(CHAIN["hidden"])
        x = torch.randn(CHAIN["steps"], 1, CHAIN["hidden"])
    else:
        raise ValueError(case)
    if case in ("MlpSmall", "MlpLarge", "SeedCnn"):
        x = torch.rand(batch, *shape)
        labels = torch.randint(0, 10, (batch,))
    model = model.to(device)  # before the optimizer takes the parameters
    if case == "SeedCnn":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    elif case == "LstmCellChain":
        opt = None
    elif case == "TinyGpt":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **adam_options)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, **adam_options)  # defaults otherwise
    return (model, opt, x.to(device), None if labels is None else labels.to(device))


def loss_of(model, x, labels):
    """The step's loss: softmax cross-entropy (mean) of the logits, [B, C] or [B, T, V]
    flattened to [B*T, V]; with no labels (LstmCellChain) the sum of the model's output."""
    out = model(x)
    if labels is None:
        return out.sum()
    if out.dim() > 2:  # [B, T, V] -> [B*T, V], labels [B, T] -> [B*T]
        out, labels = out.reshape(-1, out.size(-1)), labels.reshape(-1)
    return F.cross_entropy(out, labels)


def zero_grad(model, opt):
    """set_to_none=True, PyTorch's default."""
    (model if opt is None else opt).zero_grad()


def make_step(model, opt, x, labels):
    def step():
        zero_grad(model, opt)
        loss = loss_of(model, x, labels)
        loss.backward()
        if opt is not None:
            opt.step()
        return loss

    return step
