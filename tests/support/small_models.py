"""Small models for the backend tests (seconds to lower, every structure the placement cares about)."""

from __future__ import annotations

import torch
from torch import nn


class ConvCatReshape(nn.Module):
    """conv -> split -> conv on one half -> cat -> channel shuffle -> conv -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Conv2d(4, 4, 1)
        self.mix = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        a, b = y.chunk(2, dim=1)
        y = torch.cat([a, self.branch(b)], dim=1)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        y = torch.relu(self.mix(y))
        return self.head(y.flatten(1))


def conv_cat_reshape(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvCatReshape().eval(), (torch.randn(1, 3, 4, 4),)


def calibration(example: tuple[torch.Tensor, ...], n: int = 3) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    return [example] + [tuple(torch.randn(t.shape, generator=g) for t in example) for _ in range(n)]


class ConvBnRelu6(nn.Module):
    """conv -> batch norm -> ReLU6, twice (inference batch norms with non-trivial statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(),
                                  nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Depthwise(nn.Module):
    """MobileNet-style: pointwise expand, depthwise 3x3, pointwise project, residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.depthwise(self.expand(x)))


class LinearHead(nn.Module):
    """linear -> GELU -> linear on a token sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class Attention(nn.Module):
    """One self-attention block: q/k/v projections, softmax(q k^T / sqrt(d)) v, output projection."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        return self.out((scores @ v).transpose(1, 2).reshape(b, t, d))


class SdpaAttention(Attention):
    """`Attention` through ``scaled_dot_product_attention``, as transformers' "sdpa"
    attention writes it, with an optional mask (a constant) or a causal one."""

    def __init__(self, mask: torch.Tensor | None = None, causal: bool = False) -> None:
        super().__init__()
        self.mask, self.causal = mask, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, self.mask)

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def _with_statistics(model: nn.Module, seed: int) -> nn.Module:
    """Batch norms with random running statistics and affine parameters, so that a
    folding that differs from Arm's changes bytes (the defaults fold to identity)."""
    g = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


def conv_bn_relu6(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _with_statistics(ConvBnRelu6(), seed), (torch.randn(1, 3, 8, 8),)


def depthwise(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _with_statistics(Depthwise(), seed), (torch.randn(1, 8, 8, 8),)


def linear_head(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return LinearHead().eval(), (torch.randn(1, 6, 16),)


def attention(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return Attention().eval(), (torch.randn(1, 6, 16),)


def sdpa_attention(seed: int = 0, mask: torch.Tensor | None = None,
                   causal: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return SdpaAttention(mask, causal).eval(), (torch.randn(1, 6, 16),)


class ConvRelu6Conv(nn.Module):
    """conv -> relu6 -> conv: policy V keeps the relu6 (CLAMP) on codes."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(nn.functional.relu6(self.a(x)))


def conv_relu6_conv(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvRelu6Conv().eval(), (torch.randn(1, 3, 8, 8),)


class ConvReluCatInput(nn.Module):
    """relu(conv(x)) concatenated with x itself: the cat shares one theta between
    the relu'd half and x's negative values, so 0.0 is not the lowest code there."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([nn.functional.relu(self.conv(x)), x], dim=1)


def conv_relu_cat_input(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvReluCatInput().eval(), (torch.randn(1, 4, 8, 8),)


class ConvReluCatPooled(nn.Module):
    """Two relu'd convolutions concatenated, one of them max-pooled and upsampled
    on the way: every value the cat's domain holds is non-negative."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.max_pool2d(nn.functional.relu(self.b(x)), 2)
        return torch.cat([nn.functional.relu(self.a(x)), nn.functional.interpolate(pooled, scale_factor=2.0)], dim=1)


def conv_relu_cat_pooled(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvReluCatPooled().eval(), (torch.randn(1, 4, 8, 8),)


class MobileBlock(nn.Module):
    """A MobileNet-style block: conv+BN+ReLU6, depthwise, residual add, cat,
    channel shuffle, average pooling and a linear head (policy I's target shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8),
                                nn.ReLU6())
        self.pw = nn.Sequential(nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.side = nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y + self.pw(self.dw(y))  # inverted-residual style skip
        z = torch.cat([y, self.side(y)], dim=1)
        n, c, h, w = z.shape
        z = z.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)  # channel shuffle
        z = nn.functional.avg_pool2d(z, 2)
        z = nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)
        return self.head(z)


def mobile_block(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    m = MobileBlock()
    for mod in m.modules():  # non-trivial BN statistics, so folding matters
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m.eval(), (torch.randn(1, 3, 8, 8),)


class InceptionReduction(nn.Module):
    """An Inception reduction block: the stem's output feeds a strided convolution,
    and half of its channels a max-pool; both are concatenated, then a 1x1
    convolution. The max-pool's input is read by the convolution too, so the
    cat's domain is shared with the stem's only under ``nonlocal+share``; the
    channels that skip the pool have the widest range (scaled weights), so the
    stem's range is wider than the cat's."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.branch = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Conv2d(12, 8, 1)
        with torch.no_grad():
            self.stem[0].weight[4:] *= 4
            self.branch[0].weight /= 4

    def pooled(self, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.max_pool2d(y[:, :4], 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        return self.head(torch.cat([self.branch(y), self.pooled(y)], dim=1))


def inception_reduction(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return InceptionReduction().eval(), (torch.randn(1, 3, 8, 8),)


class ConvTopkConv(nn.Module):
    """conv | topk on the CPU | conv: topk has no TOSA lowering in executorch 1.5.1,
    so the program holds a delegate before the CPU operator and one fed by it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.topk(self.a(x), 4, dim=1).values)


def conv_topk_conv(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvTopkConv().eval(), (torch.randn(1, 3, 6, 6),)


class IntegerActivations(nn.Module):
    """Every elementwise integer row Arm lowers at policy I without a convolution:
    sub and mul of two convolutions' outputs, then sigmoid, tanh, hardswish, silu
    and gelu (INT8 TABLEs; silu is sigmoid times x), each after a 1x1 convolution."""

    ACTIVATIONS = (torch.sigmoid, torch.tanh, nn.functional.hardswish, nn.functional.silu,
                   nn.functional.gelu)

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 1)
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, 1) for _ in self.ACTIVATIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.a(x), self.b(x)
        y = (a - b) * b
        for conv, act in zip(self.convs, self.ACTIVATIONS):
            y = act(conv(y))
        return y


def integer_activations(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return IntegerActivations().eval(), (torch.randn(1, 3, 8, 8),)


class TokenNorms(nn.Module):
    """linear -> softmax -> linear -> layer norm -> linear on tokens: at policy I
    the softmax is decomposed into integer pieces; Arm's TOSA lowering has no
    INT8 layer norm for a plan to use."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.norm(self.b(torch.softmax(self.a(x), dim=-1))))


def token_norms(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return TokenNorms().eval(), (torch.randn(1, 6, 16),)


class TokenSoftmax(nn.Module):
    """linear -> softmax -> linear on tokens (the softmax row of docs/results/ethos_u.md)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.softmax(self.a(x), dim=-1))


def token_softmax(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return TokenSoftmax().eval(), (torch.randn(1, 6, 16),)


class ResidualStack(nn.Module):
    """A stem convolution and four ResNet basic blocks (conv-BN-relu-conv-BN,
    residual add, relu): the INT8 residual adds of U-Net's encoder."""

    def __init__(self, width: int = 32, blocks: int = 4) -> None:
        super().__init__()
        from torchvision.models.resnet import BasicBlock

        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(*(BasicBlock(width, width) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))


def residual_stack(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return _with_statistics(ResidualStack(), seed).eval(), (torch.randn(1, 3, 48, 48),)


class Int16Block(nn.Module):
    """Every operator kind with an int16 row (`Row.int16`), in one graph: conv + relu,
    max pool, depthwise + relu6, an add reading a convolution directly (Arm's
    widened int32 path at a16w8), slice, mul, cat, sub, clamp, nearest upsampling,
    average pool, mean, linear, permute and amax."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.c1(x))
        y = nn.functional.max_pool2d(y, 2)
        z = nn.functional.relu6(self.dw(y))
        w = self.c2(z)
        s = w + z
        t = torch.cat([s, s[:, :4] * w[:, 4:]], 1)
        d = torch.clamp(t[:, :6] - t[:, 6:], -0.5, 0.5)
        f = nn.functional.avg_pool2d(nn.functional.interpolate(d, scale_factor=2, mode="nearest"), 2)
        return self.fc(f.mean((2, 3))), f.permute(0, 2, 3, 1).amax(-1)


class Int16Sequence(nn.Module):
    """conv1d -> relu -> linear over a sequence (the 1-D spellings at int16)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).transpose(1, 2))


def int16_block(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return Int16Block().eval(), (torch.randn(1, 3, 8, 8),)


def int16_sequence(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return Int16Sequence().eval(), (torch.randn(1, 4, 12),)


class ConvChain(nn.Module):
    """A plain chain of convolutions (DS-CNN's shape): conv + relu, then depthwise and
    pointwise pairs, each with a relu, a max pool, average pooling and a linear head
    (without `pooled`, the linear reads the flattened max pool). Without cuts it is
    one precision group (`codec_tosa.quantizer.precision`)."""

    def __init__(self, pooled: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()]
        for _ in range(3):
            layers += [nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.pooled = pooled
        self.fc = nn.Linear(8 if pooled else 8 * 4 * 4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.max_pool2d(self.body(x), 2)
        if self.pooled:
            y = nn.functional.adaptive_avg_pool2d(y, 1)
        return self.fc(y.flatten(1))


def conv_chain(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvChain().eval(), (torch.randn(1, 3, 8, 8),)


def flat_conv_chain(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ConvChain(pooled=False).eval(), (torch.randn(1, 3, 8, 8),)


class ChunkConvs(nn.Module):
    """ShuffleNetV2's split: a convolution's output chunked in two halves of different
    ranges, one half read by a convolution with a bias, the other passed on, then
    concatenated. The halves share a domain; the convolution's input alone sees only
    its half's range."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        with torch.no_grad():
            self.stem.weight[4:] *= 8.0  # the second half's range is wider
        self.branch = nn.Conv2d(4, 4, 1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.relu(self.stem(x)).chunk(2, dim=1)
        return self.head(torch.cat([torch.relu(self.branch(a)), b], dim=1))


def chunk_convs(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return ChunkConvs().eval(), (torch.randn(1, 3, 8, 8),)
