"""Convolutional evaluation models: ShuffleNetV2, InceptionV3 and U-Net."""

from __future__ import annotations

import torch
from torch import nn

from codec_tosa.tools import model_libs

Example = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _seeded(seed: int, build, input_shape: tuple[int, ...]) -> Example:  # type: ignore[no-untyped-def]
    # fork_rng so that building a model never disturbs the caller's RNG.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build().eval()
        example = (torch.randn(*input_shape),)
    return model, example


def shufflenet_v2(seed: int = 0) -> Example:
    """torchvision ShuffleNetV2 x1.0, random weights, input (1, 3, 224, 224)."""
    tv = model_libs.import_torchvision()
    return _seeded(seed, lambda: tv.models.shufflenet_v2_x1_0(weights=None), (1, 3, 224, 224))


def inception_v3(seed: int = 0) -> Example:
    """torchvision InceptionV3 without the auxiliary head, input (1, 3, 299, 299)."""
    tv = model_libs.import_torchvision()
    return _seeded(
        seed,
        # init_weights=False skips scipy's truncated-normal init (slow, same shapes).
        lambda: tv.models.inception_v3(weights=None, aux_logits=False, init_weights=False),
        (1, 3, 299, 299),
    )


def mobilenet_v2(seed: int = 0) -> Example:
    """torchvision MobileNetV2, input (1, 3, 224, 224)."""
    tv = model_libs.import_torchvision()
    return _seeded(seed, lambda: tv.models.mobilenet_v2(weights=None), (1, 3, 224, 224))


def unet(seed: int = 0, size: int = 512) -> Example:
    """segmentation_models_pytorch U-Net with a ResNet-34 encoder, input (1, 3, size, size)
    (512 in the paper; `size` a multiple of 32)."""
    model_libs.prepare()
    import segmentation_models_pytorch as smp

    return _seeded(
        seed, lambda: smp.Unet(encoder_name="resnet34", encoder_weights=None), (1, 3, size, size)
    )


def unet_256(seed: int = 0) -> Example:
    """The U-Net at input (1, 3, 256, 256): the same network and weights, a quarter of the
    activations, so that the reference model and the emulation layer (lavapipe) finish in minutes."""
    return unet(seed, size=256)
