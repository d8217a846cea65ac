"""Codecs: the interface, the default INT8 affine codec and the INT16 activation codec."""

from codec_tosa.codecs.base import ChannelTheta, Theta
from codec_tosa.codecs.int8 import DEFAULT_CODEC, SYMMETRIC_CODEC, Int8Affine
from codec_tosa.codecs.int16 import INT16_CODEC, Int16Symmetric

__all__ = ["ChannelTheta", "Theta", "DEFAULT_CODEC", "SYMMETRIC_CODEC", "Int8Affine", "INT16_CODEC",
           "Int16Symmetric"]
