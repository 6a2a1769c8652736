"""Lowering: ATen operators to kernel specs, the one table from ops to the NPU kernels that run
them (`lower.py`), the graph's kernels with their costs (`costing.py`), and the user operators
that add entries to it (`custom_ops.py`, the seed's ``@custom_op``)."""
