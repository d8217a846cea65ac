"""The published figures codec-tosa tables compares against (the paper's Tables 1-4),
as printed (one decimal)."""

from __future__ import annotations

# Published storage (MiB) at Z and at Y/X/W (identical: weight compression is
# the same for every compressing policy).
PUBLISHED_STORAGE: dict[str, tuple[float, float]] = {
    "shufflenet_v2": (8.8, 2.3),
    "unet": (93.3, 23.4),
    "siglip": (329.7, 85.0),
    "smollm2": (405.1, 101.4),
}

# Table 2: traffic (MiB) at Z, Y, X, W (placement nonlocal+coalesce).
PUBLISHED_TRAFFIC: dict[str, tuple[float, float, float, float]] = {
    "shufflenet_v2": (54.8, 57.9, 58.0, 39.4),
    "unet": (920.4, 1039.9, 1095.9, 759.6),
    "siglip": (1802.7, 2029.8, 2047.8, 1768.0),
    "smollm2": (741.1, 546.3, 541.8, 427.2),
}
# Table 3: codec items (millions) at Y, X, W.
PUBLISHED_ITEMS: dict[str, tuple[float, float, float]] = {
    "shufflenet_v2": (4.2, 6.3, 4.3),
    "unet": (90.4, 138.9, 84.0),
    "siglip": (209.2, 228.1, 220.2),
    "smollm2": (47.9, 50.0, 47.1),
}
# Table 4: traffic (MiB) at W per placement: local, nonlocal, nonlocal+coalesce.
PUBLISHED_PLACEMENT: dict[str, tuple[float, float, float]] = {
    "shufflenet_v2": (70.6, 39.4, 39.4),
    "unet": (1251.1, 767.1, 759.6),
    "siglip": (2311.8, 1768.0, 1768.0),
    "smollm2": (643.1, 427.2, 427.2),
}

# The paper's policies and placements, in its tables' column order.
PAPER_POLICIES: tuple[str, ...] = ("Z", "Y", "X", "W")
PAPER_PLACEMENTS: tuple[str, ...] = ("local", "nonlocal", "nonlocal+coalesce")
