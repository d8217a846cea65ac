"""Transformer models: SmolVLM2-256M's SigLIP tower and SmolLM2 decoder (prefill, and one decode
step with a static KV cache as ExecuTorch builds its LLMs), and a 2-layer ViT block."""

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


def siglip(seed: int = 0, num_layers: int = 12) -> Example:
    """SigLIP vision tower of SmolVLM2-256M, no pooling head, input (1, 3, 512, 512).

    SiglipVisionModel rather than SmolVLM's own vision class: the latter
    emits aten.bucketize (not core ATen) and computes the same for a full image.
    num_layers is for tests on a shallower copy.
    """
    model_libs.prepare()
    from transformers import SiglipVisionConfig, SiglipVisionModel

    config = SiglipVisionConfig(
        hidden_size=768,
        num_hidden_layers=num_layers,
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


def smollm2(seed: int = 0, num_layers: int = 30, seq_len: int = 128) -> Example:
    """SmolLM2 text decoder of SmolVLM2-256M fed inputs_embeds (1, 128, 576).

    No embedding table and no LM head: the model starts at the embeddings and
    ends at the final RMSNorm. num_layers and seq_len (tokens; the paper's is
    128) are for tests on a smaller copy.
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

    return _seeded_tower(seed, decoder, "inputs_embeds", (1, seq_len, 576))


# SmolLM2-135M's shape in executorch's own LLM model (examples/models/llama); the
# static KV cache holds SMOLLM2_DECODE_CONTEXT positions.
SMOLLM2_DECODE_CONTEXT = 128
SMOLLM2_VOCAB = 49152


def smollm2_decode(seed: int = 0, num_layers: int = 30, prompt_len: int = 5,
                   vocab_size: int = SMOLLM2_VOCAB) -> Example:
    """One decode step of SmolLM2-135M with a static KV cache of 128 positions, built as
    ExecuTorch builds its LLMs: executorch's ``construct_transformer(ModelArgs(...))``,
    called as ``model(tokens [1, 1] long, {"input_pos": pos [1] long})`` -> logits (1, 49152).

    The K and V caches are mutable buffers (1, 3, 128, 64) per layer: the step writes
    its own position (``index_put``) and attends over positions 0..pos through the
    model's causal mask. Before returning, the builder decodes a seeded random prompt
    of `prompt_len` tokens (positions 0..prompt_len-1) so the caches hold that prompt;
    the example is the next token at position `prompt_len`. A step at a fixed
    position writes only that position and reads only positions up to it, so it
    computes the same for the same input however often it runs (calibration,
    reference outputs). The LM head holds a copy of the embedding table, as
    executorch's SmolLM2 checkpoint conversion ties them. num_layers is for tests on
    a shallower copy, and vocab_size (SmolLM2's is 49,152) for one with a smaller
    embedding table and LM head.
    """
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    if not 0 <= prompt_len < SMOLLM2_DECODE_CONTEXT:
        raise ValueError(f"prompt_len must be in [0, {SMOLLM2_DECODE_CONTEXT}), got {prompt_len}")
    args = ModelArgs(
        dim=576,
        n_layers=num_layers,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        hidden_dim=1536,
        vocab_size=vocab_size,
        norm_eps=1e-5,
        max_seq_len=SMOLLM2_DECODE_CONTEXT,
        max_context_len=SMOLLM2_DECODE_CONTEXT,
        use_kv_cache=True,
        enable_dynamic_shape=False,
        rope_theta=100000.0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = construct_transformer(args).eval()
        # Export fails on in-place cache writes into a graph that requires grad.
        model.requires_grad_(False)
        with torch.no_grad():
            model.output.weight.copy_(model.tok_embeddings.weight)
        tokens = torch.randint(0, args.vocab_size, (prompt_len + 1,))
    with torch.no_grad():
        for pos in range(prompt_len):
            model(tokens[pos].view(1, 1), {"input_pos": torch.tensor([pos])})
    return model, (tokens[prompt_len].view(1, 1), {"input_pos": torch.tensor([prompt_len])})
