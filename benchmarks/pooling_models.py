"""The two pooling benchmark models that are not in `codec_tosa_examples.models`.

Both use seeded random weights and never touch the network.

* ``conformer``: transformers' `Wav2Vec2ConformerModel` (feature encoder +
  Conformer encoder), hidden 144, 2 layers, 4 heads, FFN 576, depthwise kernel
  15, rotary position embeddings, a 3-layer conv feature encoder with 64
  channels; input 1 x 3200 raw samples (0.2 s at 16 kHz, 159 frames).
* ``sd3_block``: one diffusers `JointTransformerBlock` (the MMDiT block of
  Stable Diffusion 3): dim 256, 4 heads x 64, RMS qk-norm, 64 image tokens
  (an 8 x 8 latent patch grid), 32 text tokens, one timestep embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from codec_tosa.tools import model_libs

Example = tuple[nn.Module, tuple[torch.Tensor, ...]]


def conformer(seed: int = 0) -> Example:
    model_libs.prepare()
    from transformers import Wav2Vec2ConformerConfig, Wav2Vec2ConformerModel

    torch.manual_seed(seed)
    config = Wav2Vec2ConformerConfig(
        hidden_size=144,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=576,
        conv_depthwise_kernel_size=15,
        position_embeddings_type="rotary",
        conv_dim=(64, 64, 64),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        feat_extract_norm="group",
        do_stable_layer_norm=True,
        mask_time_prob=0.0,
    )

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Wav2Vec2ConformerModel(config)

        def forward(self, audio: torch.Tensor) -> torch.Tensor:
            return self.model(audio).last_hidden_state

    return Encoder().eval(), (torch.randn(1, 3200),)


def sd3_block(seed: int = 0) -> Example:
    model_libs.prepare()
    from diffusers.models.attention import JointTransformerBlock

    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = JointTransformerBlock(
                dim=256, num_attention_heads=4, attention_head_dim=64, qk_norm="rms_norm"
            )

        def forward(
            self, image: torch.Tensor, text: torch.Tensor, temb: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            text_out, image_out = self.block(image, text, temb)
            return image_out, text_out

    inputs = (torch.randn(1, 64, 256), torch.randn(1, 32, 256), torch.randn(1, 256))
    return Block().eval(), inputs


BENCH_MODELS = {"conformer": conformer, "sd3_block": sd3_block}
