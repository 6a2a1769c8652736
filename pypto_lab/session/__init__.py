"""The seed article's session: the settings a user changes between calls
(`settings.py`: `set_optimization_options`, the allocator; `memory.py`: the memory pool) and the
public `pypto_lab.optimize` that reads them (`optimize.py`). The only mutable settings of the
package live here, above everything they configure."""
