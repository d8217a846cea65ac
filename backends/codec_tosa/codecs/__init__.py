"""Codecs: the interface, the default INT8 affine codec, the INT16 activation codec and the
INT4 weight codec."""

from codec_tosa.codecs.base import ChannelTheta, Theta
from codec_tosa.codecs.int8 import DEFAULT_CODEC, SYMMETRIC_CODEC, Int8Affine
from codec_tosa.codecs.int16 import INT16_CODEC, Int16Symmetric
from codec_tosa.codecs.int4 import INT4_WEIGHT_CODEC, Int4Weight

__all__ = ["ChannelTheta", "Theta", "DEFAULT_CODEC", "SYMMETRIC_CODEC", "Int8Affine", "INT16_CODEC",
           "Int16Symmetric", "INT4_WEIGHT_CODEC", "Int4Weight"]
