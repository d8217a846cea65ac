"""The four digit classifiers: input (N, 1, 32, 32), 10 logits.

ResNet-8 and DS-CNN are executorch's MLPerf Tiny classes
(``executorch.examples.models.mlperf_tiny``), imported and changed only where
the input or the target demands it; MobileNet-style and ViT are written here
from plain ``torch.nn`` ops that ``torch.export`` handles with static shapes.
"""

from __future__ import annotations

import math

import torch
from executorch.examples.models.mlperf_tiny import DSCNNKWS, ResNet8
from torch import nn

from .data import CLASSES, SIZE


class DigitsResNet8(ResNet8):
    """MLPerf Tiny ResNet-8 ([16, 32, 64] residual stages), unchanged except that
    the entry convolution takes 1 grey channel instead of 3 RGB channels."""

    def __init__(self, n_classes: int = CLASSES) -> None:
        super().__init__(n_classes=n_classes)
        # The class hard-codes 3 input channels; replace just that conv (same
        # kernel, stride, padding, no bias: it is followed by the BatchNorm).
        self.entry[0] = nn.Conv2d(1, self.entry[0].out_channels, 3, stride=1, padding=1, bias=False)


class DigitsDSCNN(DSCNNKWS):
    """MLPerf Tiny keyword-spotting DS-CNN (a (10, 4)-stride-2 conv, four 64-channel
    depthwise-separable blocks), already 1-channel; two changes:

    * 10 classes instead of 12;
    * AvgPool2d((24, 5)), sized for the 49x10 spectrogram, becomes
      AdaptiveAvgPool2d(1), as Arm's own tests do (Ethos-U55 stride limit). On
      32x32 input the features are 17x16, so this is a global average pool.
    """

    def __init__(self, n_classes: int = CLASSES) -> None:
        super().__init__(num_classes=n_classes)
        self.input_height = SIZE
        self.input_width = SIZE
        self.pool = nn.AdaptiveAvgPool2d(1)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class _InvertedResidual(nn.Module):
    """MobileNetV2 block, stride 1: expand 1x1, depthwise 3x3, linear 1x1 project, + x."""

    def __init__(self, channels: int, expand: int) -> None:
        super().__init__()
        hidden = channels * expand
        self.block = nn.Sequential(
            _conv_bn(channels, hidden, 1),
            _conv_bn(hidden, hidden, 3, groups=hidden),
            _conv_bn(hidden, channels, 1, act=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class DigitsMobileNet(nn.Module):
    """32x32 stem (stride 2) -> depthwise-separable 16->32 -> depthwise-separable
    32->48 (stride 2) -> inverted residual (x4 expansion) on 8x8x48 -> global
    average pool -> linear. BatchNorm + ReLU6 throughout, as MobileNetV1/V2."""

    def __init__(self, n_classes: int = CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn(1, 16, 3, stride=2),  # 16x16
            _conv_bn(16, 16, 3, groups=16),  # depthwise separable 1
            _conv_bn(16, 32, 1),
            _conv_bn(32, 32, 3, stride=2, groups=32),  # depthwise separable 2, 8x8
            _conv_bn(32, 48, 1),
            _InvertedResidual(48, expand=4),
        )
        self.head = nn.Linear(48, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        return self.head(x.mean((2, 3)))


class _Attention(nn.Module):
    """Multi-head self-attention written out (matmul + softmax), no fused kernels,
    so that the exported graph is plain linear / reshape / permute / bmm / softmax."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (b, heads, t, head_dim)
        attn = torch.softmax(torch.matmul(q * self.scale, k.transpose(-2, -1)), dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


class _Block(nn.Module):
    """Pre-norm transformer encoder layer: x + attn(LN(x)), x + MLP(LN(x)), GELU MLP."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * mlp_ratio), nn.GELU(), nn.Linear(dim * mlp_ratio, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DigitsViT(nn.Module):
    """4x4 patches of the 32x32 image (64 tokens; one patch is one original
    8x8 pixel after the 4x upsampling), dim 48, 3 heads, 2 layers, MLP ratio 2,
    learned position embedding, final LayerNorm, mean pooling (no class token, so
    no concatenation), linear head. (Dim 32 / 2 heads reached only 97.5% clean.)"""

    def __init__(
        self,
        n_classes: int = CLASSES,
        patch: int = 4,
        dim: int = 48,
        heads: int = 3,
        depth: int = 2,
        mlp_ratio: int = 2,
    ) -> None:
        super().__init__()
        tokens = (SIZE // patch) ** 2
        self.patch_embed = nn.Conv2d(1, dim, patch, stride=patch)
        self.pos = nn.Parameter(torch.zeros(1, tokens, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.Sequential(*[_Block(dim, heads, mlp_ratio) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos  # (b, tokens, dim)
        x = self.norm(self.blocks(x))
        return self.head(x.mean(1))


# name -> constructor; the order is the order of MODELS.
ARCHITECTURES: dict[str, type[nn.Module]] = {
    "digits_resnet8": DigitsResNet8,
    "digits_ds_cnn": DigitsDSCNN,
    "digits_mobilenet": DigitsMobileNet,
    "digits_vit": DigitsViT,
}
