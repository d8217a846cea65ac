"""Re-estimate batch-norm running statistics on seeded random batches.

A randomly initialised network keeps PyTorch's default running statistics
(mean 0, variance 1), which do not match its activations: through a deep
stack of such batch norms the activations shrink or blow up, and e.g.
MobileNetV2's output becomes constant, so that any SQNR against it is 0 dB
and means nothing. Re-estimating the statistics on random inputs gives the
activations the spread a trained network has.
"""

from __future__ import annotations

import torch
from torch import nn


def reestimate_batch_norms(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], *,
                           batches: int = 4, batch_size: int = 8, seed: int = 1000) -> int:
    """Replace every batch norm's running statistics of `model` by their
    cumulative average over `batches` seeded random batches shaped like
    `example_inputs` (batch dimension `batch_size`). Leaves `model` in eval
    mode and the caller's RNG untouched; returns the number of batch norms."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return 0
    saved = {m: m.momentum for m in norms}
    gen = torch.Generator().manual_seed(seed)
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over all batches, not an exponential one
    # only the batch norms train: dropout stays off and draws nothing from the caller's RNG
    model.eval()
    for m in norms:
        m.train()
    try:
        with torch.no_grad():
            for _ in range(batches):
                model(*(torch.randn((batch_size, *t.shape[1:]), generator=gen, dtype=t.dtype)
                        for t in example_inputs))
    finally:
        for m, momentum in saved.items():
            m.momentum = momentum
        model.eval()
    return len(norms)
