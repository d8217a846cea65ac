"""executorch's MLPerf Tiny models (`executorch.examples.models.mlperf_tiny`), built as
Arm's own model tests build them (`backends/arm/test/models/test_*.py`), with seeded
random weights:

* DS-CNN (keyword spotting, 1x1x49x10): the final `AvgPool2d(24, 5)` is an
  `AdaptiveAvgPool2d(1)`, as in Arm's test (Ethos-U55's stride limit);
* MobileNetV1-0.25 (visual wake words, 1x3x96x96) and ResNet-8 (image
  classification, 1x3x32x32): as they are;
* the deep autoencoder (anomaly detection, 1x640): each Linear + BatchNorm1d
  pair fused into one Linear, as in Arm's test (`deep_autoencoder`), or as
  built (`deep_autoencoder_bn`).
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


def _built(wrapper_cls: type) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(SEED)
    wrapper = wrapper_cls()
    return wrapper.get_eager_model().eval(), tuple(wrapper.get_example_inputs())


def ds_cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from executorch.examples.models.mlperf_tiny import DSCNNKWSModel

    model, inputs = _built(DSCNNKWSModel)
    model.pool = nn.AdaptiveAvgPool2d(output_size=1)  # as Arm's test: U55 cannot stride 5
    return model, inputs


def mobilenet_v1_025() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from executorch.examples.models.mlperf_tiny import MobileNetV1025Model

    return _built(MobileNetV1025Model)


def resnet8() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from executorch.examples.models.mlperf_tiny import ResNet8Model

    return _built(ResNet8Model)


def deep_autoencoder_bn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The autoencoder as built, Linear + BatchNorm1d pairs unfused."""
    from executorch.examples.models.mlperf_tiny import DeepAutoEncoderModel

    return _built(DeepAutoEncoderModel)


def deep_autoencoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The autoencoder with each Linear + BatchNorm1d fused, as Arm's test builds it."""
    model, inputs = deep_autoencoder_bn()
    return _fuse_linear_bn(model), inputs


def _fuse_linear_bn(module: nn.Module) -> nn.Module:
    from torch.nn.utils.fusion import fuse_linear_bn_eval

    for name, child in module.named_children():
        if isinstance(child, nn.Sequential):
            layers = list(child)
            fused: list[nn.Module] = []
            i = 0
            while i < len(layers):
                if (isinstance(layers[i], nn.Linear) and i + 1 < len(layers)
                        and isinstance(layers[i + 1], nn.BatchNorm1d)):
                    fused.append(fuse_linear_bn_eval(layers[i], layers[i + 1]))
                    i += 2
                else:
                    fused.append(_fuse_linear_bn(layers[i]))
                    i += 1
            setattr(module, name, nn.Sequential(*fused))
        else:
            _fuse_linear_bn(child)
    return module


MLPERF_TINY = ("ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder")
