"""The plan as a PT2E quantizer: `CodecQuantizer`, its observers, module selection,
precision per domain, the precision search and weight rounding."""
