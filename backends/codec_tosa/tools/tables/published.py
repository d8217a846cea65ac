"""The published figures codec-tosa tables compares against (the paper's Tables 1-4)."""

from __future__ import annotations

# Published storage (MiB) at Z and at Y/X/W (identical: weight compression is
# the same for every compressing policy).
PUBLISHED_STORAGE: dict[str, tuple[float, float]] = {
    "shufflenet_v2": (8.8, 2.3),
    "unet": (93.3, 23.4),
    "siglip": (329.7, 85.0),
    "smollm2": (405.1, 101.4),
}
