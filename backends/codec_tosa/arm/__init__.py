"""executorch's Arm backend as codec_tosa uses it: its private surface (guarded), its pass
pipeline with ours in it, the adapter every other module goes through, and stock Arm's own flows."""
