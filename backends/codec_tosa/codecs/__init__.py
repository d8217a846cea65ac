"""Codecs: the interface and the default INT8 affine codec."""

from codec_tosa.codecs.base import ChannelTheta, Theta
from codec_tosa.codecs.int8 import DEFAULT_CODEC, SYMMETRIC_CODEC, Int8Affine

__all__ = ["ChannelTheta", "Theta", "DEFAULT_CODEC", "SYMMETRIC_CODEC", "Int8Affine"]
