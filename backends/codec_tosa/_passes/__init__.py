"""codec_tosa's own graph passes, run inside Arm's TOSA pass pipeline (see `arm_adapter`)."""
