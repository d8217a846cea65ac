"""The codec interface: element widths, learning theta, and its JSON form.

The placement and traffic model only need the widths; calibration learns
theta from observed ranges; materialisation turns theta into graph nodes.
INT4, FP8 or block-scaled codecs implement the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Theta:
    """Per-tensor affine parameters: code = clamp(round(x / scale) + zero_point)."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: torch.dtype

    def to_json(self) -> dict[str, Any]:
        return {"scale": self.scale, "zero_point": self.zero_point, "qmin": self.qmin,
                "qmax": self.qmax, "dtype": str(self.dtype).replace("torch.", "")}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Theta":
        return Theta(float(d["scale"]), int(d["zero_point"]), int(d["qmin"]), int(d["qmax"]),
                     getattr(torch, d["dtype"]))


@dataclass(frozen=True)
class ChannelTheta:
    """Per-channel symmetric parameters for offline-encoded weights."""

    scales: torch.Tensor  # float32, one per channel along `axis`
    axis: int
    qmin: int
    qmax: int
    dtype: torch.dtype

