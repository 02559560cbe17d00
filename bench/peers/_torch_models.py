"""The PyTorch models, data and training step of torch_peers.py (CPU) and torch_cuda_peers.py.

Import after the caller has set its environment (threads, CUDA_VISIBLE_DEVICES): this imports
torch.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def make_case(case, device="cpu", **adam_options):
    """(model, optimizer, x, labels) with fixed random data, on `device`.

    The model and data are made on the CPU with seed 0 and then moved, so every device trains
    the same weights on the same data. `adam_options` go to torch.optim.Adam (the MLP cases).
    """
    torch.manual_seed(0)
    if case == "MlpSmall":
        model, batch, shape = mlp(100), 32, (784,)
    elif case == "MlpLarge":
        model, batch, shape = mlp(1000), 100, (784,)
    elif case == "SeedCnn":
        model, batch, shape = SeedCnn(), 32, (1, 28, 28)
    else:
        raise ValueError(case)
    x = torch.rand(batch, *shape)
    labels = torch.randint(0, 10, (batch,))
    model = model.to(device)  # before the optimizer takes the parameters
    if case == "SeedCnn":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, **adam_options)  # defaults otherwise
    return model, opt, x.to(device), labels.to(device)


def make_step(model, opt, x, labels):
    def step():
        opt.zero_grad()  # set_to_none=True, PyTorch's default
        loss = F.cross_entropy(model(x), labels)  # softmax cross-entropy, mean
        loss.backward()
        opt.step()
        return loss

    return step
