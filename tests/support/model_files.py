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
