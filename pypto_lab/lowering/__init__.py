"""Lowering: ATen operators to kernel specs, for every front end (inference, LLM graphs, training).

`table.py` is the one table from ATen ops, forward and backward, to the NPU operators that run
them, with its bookkeeping and host-fallback rules; `lower.py` the rules that size a node's
kernels (`train_ops.py` those of the training-only ops), under a `Precision` (`precision.py`);
`fusion.py` the one Vector fusion mechanism; `costing.py` a graph's kernels with their costs;
`custom_ops.py` and `custom.py` the user operators that add entries to the table (the seed's
``@custom_op``)."""
