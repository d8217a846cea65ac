"""TOSA: codec_tosa's own delegate, `CodecTosaPartitioner` and `CodecTosaBackend`."""
