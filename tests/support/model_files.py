"""Model files for the command-line tests (`codec-tosa compile path/to/model.py:build`)."""

# conv -> relu -> conv: one delegate, a ReLU in FP32 between two encoded convolutions at W
SMALL_MODEL_FILE = '''
import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def build():
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(1, 3, 8, 8),)
'''

# a linear embedding, two pre-LayerNorm transformer layers (softmax attention, GELU
# MLP) and a final LayerNorm: every FP32 operator Arm decomposes feeds an encode at
# W, and the first LayerNorm reads a decode (Arm re-quantises its mean)
TRANSFORMER_MODEL_FILE = '''
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.out((a @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 32)
        self.layers = nn.Sequential(Layer(), Layer())
        self.ln = nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(self.layers(self.embed(x)))


def build():
    torch.manual_seed(0)
    return Encoder().eval(), (torch.randn(1, 16, 32),)
'''
