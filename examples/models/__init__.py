"""Model builders: the paper's evaluation models and a tiny demo model.

Every builder returns ``(module in eval mode, example_inputs tuple)`` with
seeded random weights and never touches the network. ``load_model`` resolves
a built-in name or a ``path/to/file.py:function`` spec.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .mlperf_tiny import deep_autoencoder, deep_autoencoder_bn, ds_cnn, mobilenet_v1_025, resnet8
from .tiny import tiny_shufflenet
from .trained import digits_ds_cnn, digits_mobilenet, digits_resnet8, digits_vit
from .transformer import siglip, smollm2, smollm2_decode, vit_tiny
from .vision import inception_v3, mobilenet_v2, shufflenet_v2, unet, unet_256

ModelAndInputs = tuple[nn.Module, tuple[torch.Tensor, ...]]
Builder = Callable[[], ModelAndInputs]

BUILTIN_MODELS: dict[str, Builder] = {
    "tiny_shufflenet": tiny_shufflenet,
    "shufflenet_v2": shufflenet_v2,
    "unet": unet,
    "siglip": siglip,
    "smollm2": smollm2,
    # one decode step of SmolLM2-135M with a static KV cache, executorch's LLM model
    "smollm2_decode": smollm2_decode,
    "inception_v3": inception_v3,
    "mobilenet_v2": mobilenet_v2,
    "vit_tiny": vit_tiny,
    "unet_256": unet_256,
    # Trained on sklearn's digits, committed weights (trained/weights/).
    "digits_resnet8": digits_resnet8,
    "digits_ds_cnn": digits_ds_cnn,
    "digits_mobilenet": digits_mobilenet,
    "digits_vit": digits_vit,
    # executorch's MLPerf Tiny models, as Arm's model tests build them (mlperf_tiny.py)
    "ds_cnn": ds_cnn,
    "mobilenet_v1_025": mobilenet_v1_025,
    "resnet8": resnet8,
    "deep_autoencoder": deep_autoencoder,
    "deep_autoencoder_bn": deep_autoencoder_bn,
}

# The four models of the paper's tables, in table order.
PAPER_MODELS: tuple[str, ...] = ("shufflenet_v2", "unet", "siglip", "smollm2")


def _builder_from_file(spec: str, path_text: str, func_name: str) -> Builder:
    path = Path(path_text)
    if not path.is_file():
        raise ValueError(f"model spec {spec!r}: file {path_text!r} does not exist")
    module_name = f"_codec_tosa_user_model_{abs(hash(path.resolve()))}"
    # Import each file once per process: re-running it could, e.g., register
    # its custom operators twice.
    module = sys.modules.get(module_name)
    if module is None:
        import_spec = importlib.util.spec_from_file_location(module_name, path)
        if import_spec is None or import_spec.loader is None:
            raise ValueError(f"model spec {spec!r}: cannot import {path_text!r} as Python")
        module = importlib.util.module_from_spec(import_spec)
        sys.modules[module_name] = module
        try:
            import_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"model spec {spec!r}: {path_text!r} has no function {func_name!r}")
    return func


def resolve_builder(spec: str) -> Builder:
    """The builder for a built-in name or ``path/to/file.py:function``, not yet called.

    Lets a caller reject every bad spec before spending minutes on the good ones.
    """
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec]
    if ":" in spec:
        path_text, func_name = spec.rsplit(":", 1)
        return _builder_from_file(spec, path_text, func_name)
    known = ", ".join(BUILTIN_MODELS)
    raise ValueError(f"unknown model {spec!r}: expected one of {known} or path/to/file.py:function")


def load_model(spec: str) -> ModelAndInputs:
    """Build a model from a built-in name or ``path/to/file.py:function``."""
    result = resolve_builder(spec)()
    if (
        not isinstance(result, tuple)
        or len(result) != 2
        or not isinstance(result[0], nn.Module)
        or not isinstance(result[1], tuple)
    ):
        raise ValueError(
            f"model spec {spec!r}: the builder must return (torch.nn.Module, tuple of example inputs)"
        )
    module, inputs = result
    return module.eval(), inputs


__all__ = [
    "BUILTIN_MODELS",
    "PAPER_MODELS",
    "ModelAndInputs",
    "digits_ds_cnn",
    "digits_mobilenet",
    "digits_resnet8",
    "digits_vit",
    "inception_v3",
    "mobilenet_v2",
    "load_model",
    "resolve_builder",
    "shufflenet_v2",
    "siglip",
    "smollm2",
    "smollm2_decode",
    "tiny_shufflenet",
    "unet",
    "unet_256",
    "vit_tiny",
]
