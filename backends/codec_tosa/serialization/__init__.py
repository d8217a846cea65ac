"""TOSA serialization: constant pooling and flatbuffer inspection.

* `pooled.PooledTosaSerializer`: helper constants pooled per basic block.
* `const_shape_dedup.dedup_const_shapes`: the FX pass merging static CONST_SHAPE nodes.
* `tosa_stats.tosa_stats`: operators, constants, tensors, traffic of a flatbuffer.
* `pooling_record`: pooling statistics stored in (and read back from) the .pte.
* `reference_check`: bit-for-bit comparison on the TOSA reference model.
"""
