"""TOSA serialization: constant pooling and flatbuffer inspection.

* `pooled.PooledTosaSerializer`: helper constants pooled per basic block (`MarkingTosaSerializer`:
  graph-owned constants marked, nothing pooled).
* `memory_plan.activation_plan`: peak activation memory, a liveness plan of the non-constant tensors.
* `external`: external weights, the graph-owned constants as named data beside the .pte.
* `pooling_record`: pooling statistics stored in the .pte (read back by `runtime.pte`).
* `tosa_stats.tosa_stats`: operators, constants, tensors, unfused and fused traffic of a flatbuffer.
"""
