"""codec_tosa: non-local codec placement for ExecuTorch TOSA delegates."""
