"""Models whose inputs and outputs are not one float tensor: bool and inf/NaN
outputs, an input mutated in place, nested inputs and outputs (issues 22, 27), a
buffer the program mutates (issue 51).
Each builder returns (module in eval mode, example inputs)."""

import torch
from torch import nn

class Compare(nn.Module):
    def __init__(self):
        super().__init__(); self.c = nn.Conv2d(3, 4, 3, padding=1)
    def forward(self, x):
        y = self.c(x)
        return y, y > 0

def compare():
    torch.manual_seed(0); return Compare().eval(), (torch.randn(1, 3, 8, 8),)

class InPlace(nn.Module):
    def __init__(self):
        super().__init__(); self.c = nn.Conv2d(3, 3, 3, padding=1)
    def forward(self, x):
        x.add_(1.0)
        return self.c(x)

def in_place():
    torch.manual_seed(0); return InPlace().eval(), (torch.randn(1, 3, 8, 8),)

class Nested(nn.Module):
    def __init__(self):
        super().__init__(); self.lstm = nn.LSTM(8, 16, batch_first=True); self.fc = nn.Linear(16, 4)
    def forward(self, x, state):
        y, (h, c) = self.lstm(x, state)
        return {"logits": self.fc(y[:, -1]), "state": (h, c)}

def nested():
    torch.manual_seed(0)
    return Nested().eval(), (torch.randn(1, 5, 8), (torch.zeros(1, 1, 16), torch.zeros(1, 1, 16)))

class Log(nn.Module):
    def forward(self, x):
        return torch.log(x), 1.0 / x

def log():
    return Log().eval(), (torch.rand(1, 16) * torch.tensor([0.0] + [1.0] * 15),)

def circular():
    torch.manual_seed(0)
    return nn.Conv2d(3, 4, 5, padding=2, padding_mode="circular").eval(), (torch.randn(1, 3, 19, 19),)


class ConvBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.c(x))


def conv_bn():
    torch.manual_seed(0)
    m = ConvBn().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, (torch.randn(1, 3, 8, 8),)


class SelfAttention(nn.Module):
    """A multi-head attention called as Arm's test calls it, mha(x, x, x): torch.export
    specialises on the aliasing and reads one input."""

    def __init__(self) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.mha(q, k, v, need_weights=False)[0]


def self_attention():
    torch.manual_seed(0)
    x = torch.randn(3, 2, 8)
    return SelfAttention().eval(), (x, x, x)


class Scaled(nn.Module):
    """Non-tensor inputs (a scalar, a dim, None), as Arm's operator tests pass them."""

    def forward(self, x: torch.Tensor, alpha: float, dim: int, mode: str | None) -> torch.Tensor:
        return torch.div(x * alpha, 3.0, rounding_mode=mode).sum(dim)


def scaled():
    torch.manual_seed(0)
    return Scaled().eval(), (torch.randn(2, 3, 4), 2.5, 1, None)


class HalfLog10(nn.Module):
    """log10: no TOSA partitioner here delegates it (log10_bf16: nor a bfloat16 program)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log10(x)


def log10():
    return HalfLog10().eval(), (torch.rand(2, 3) + 0.5,)


def log10_bf16():
    return HalfLog10().eval(), (torch.rand(2, 3, dtype=torch.bfloat16) + 0.5,)


def instance_norm():
    """Arm's test_nn_modules InstanceNorm2d: nothing CodecQuantizer annotates."""
    return nn.InstanceNorm2d(6).eval(), (torch.rand(1, 6, 16, 16),)


class Cond(nn.Module):
    """torch.cond on a full reduction, as Arm's test_cond: the predicate is a
    rank-0 tensor at the delegate boundary, which TOSA gives the shape [1]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda a: torch.sin(a), lambda a: torch.cos(a), [x])


def cond():
    torch.manual_seed(0)
    return Cond().eval(), (torch.randn(1, 4, 4),)


class NestedCell(nn.Module):
    """A recurrent cell's shape of program: (x, (h, c)) in, {"logits", "state": (h, c)} out."""
    def __init__(self):
        super().__init__(); self.fc = nn.Linear(8, 16); self.out = nn.Linear(16, 4)
    def forward(self, x, state):
        h, c = state
        y = torch.relu(self.fc(x) + h)
        return {"logits": self.out(y), "state": (y, c + y)}

def nested_cell():
    torch.manual_seed(0)
    return NestedCell().eval(), (torch.randn(1, 8), (torch.zeros(1, 16), torch.zeros(1, 16)))


class ViewFp16(nn.Module):
    """Arm's test_view rand_4d_4d_fp16: a view read twice by a product, in float16."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x.view(3, 2, 3, 1)
        return v * v


def view_fp16():
    torch.manual_seed(0)
    return ViewFp16().eval(), (torch.rand(2, 1, 1, 9, dtype=torch.float16),)


def conv_fp16():
    """Arm's test_conv2d fp16 cases: a float16 convolution's weight and bias."""
    torch.manual_seed(0)
    return nn.Conv2d(3, 4, 3).half().eval(), (torch.randn(1, 3, 8, 8, dtype=torch.float16),)


class PrefilledCache(nn.Module):
    """A decode step in small (issue 51): a buffer the step writes at its position
    (index_put) and reads whole, filled by earlier steps before export, so the
    program's buffer state is not zeros."""

    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(8, 8), nn.Linear(8, 4)
        self.register_buffer("cache", torch.zeros(1, 6, 8))

    def forward(self, x, pos):
        self.cache[:, pos] = self.proj(x)
        return torch.softmax(self.out(self.cache.mean(1)), dim=-1)


def prefilled_cache():
    torch.manual_seed(0)
    model = PrefilledCache().eval().requires_grad_(False)
    with torch.no_grad():
        for pos in range(3):  # a prompt: positions 0..2; the example writes position 3
            model(torch.randn(1, 8), torch.tensor([pos]))
    return model, (torch.randn(1, 8), torch.tensor([3]))
