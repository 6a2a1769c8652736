"""The driver of the inference path (`optimize.py`): capture a model, run an optimisation level's
passes, cost every kernel, run the analyses, and wrap the result as an `OptimizedModel`. It takes
every setting as an argument; the seed article's session settings live in `pypto_lab.session`."""
