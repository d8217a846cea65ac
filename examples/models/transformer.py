"""Transformer models: SmolVLM2-256M's SigLIP tower and SmolLM2 decoder, and a 2-layer ViT block."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from codec_tosa.tools import model_libs

Example = tuple[nn.Module, tuple[torch.Tensor, ...]]


class _LastHidden(nn.Module):
    """Return the last hidden state as a plain tensor (export-friendly output)."""

    def __init__(self, inner: nn.Module, kwarg: str) -> None:
        super().__init__()
        self.inner = inner
        self.kwarg = kwarg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(**{self.kwarg: x}).last_hidden_state


def _seeded_tower(seed: int, build: Callable[[], nn.Module], kwarg: str,
                  input_shape: tuple[int, ...]) -> Example:
    """`build()` and one random input of `input_shape`, both from `seed` (the caller's
    random state is left alone); the tower returns its last hidden state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = _LastHidden(build(), kwarg).eval()
        example = (torch.randn(*input_shape),)
    return model, example


def vit_tiny(seed: int = 0) -> Example:
    """A 2-layer transformers ViT: hidden 64, 4 heads, 32x32 input, patch 8, SDPA attention.

    Small enough for the reference model and the emulation layer, with every
    transformer operator (LayerNorm, softmax attention, GELU, the class token).
    """
    model_libs.prepare()
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        attn_implementation="sdpa",
    )
    return _seeded_tower(seed, lambda: ViTModel(config, add_pooling_layer=False), "pixel_values",
                         (1, 3, 32, 32))


def siglip(seed: int = 0) -> Example:
    """SigLIP vision tower of SmolVLM2-256M, no pooling head, input (1, 3, 512, 512).

    SiglipVisionModel rather than SmolVLM's own vision class: the latter
    emits aten.bucketize (not core ATen) and computes the same for a full image.
    """
    model_libs.prepare()
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        patch_size=16,
        image_size=512,
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
        # One fused attention operator, as the paper's export shows it (docs/DESIGN.md):
        # the analysis keeps it whole; lowering decomposes it like any other op.
        attn_implementation="sdpa",
    )
    return _seeded_tower(seed, lambda: SiglipVisionModel(config), "pixel_values", (1, 3, 512, 512))


def smollm2(seed: int = 0, num_layers: int = 30) -> Example:
    """SmolLM2 text decoder of SmolVLM2-256M fed inputs_embeds (1, 128, 576).

    No embedding table and no LM head: the model starts at the embeddings and
    ends at the final RMSNorm. num_layers is for tests on a shallower copy.
    """
    model_libs.prepare()
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=1,  # the embedding table is deleted below
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=num_layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        use_cache=False,
        # One fused attention operator, as the paper's export shows it (docs/DESIGN.md):
        # the analysis keeps it whole; lowering decomposes it like any other op.
        attn_implementation="sdpa",
    )
    def decoder() -> nn.Module:
        inner = LlamaModel(config)
        inner.embed_tokens = None
        return inner

    return _seeded_tower(seed, decoder, "inputs_embeds", (1, 128, 576))
