"""``pypto.operation``: the real module's ``op_wrapper`` (python/pypto/_op_wrapper.py at 883e7df),
which the model files put on their own helper ops (``@op_wrapper def scalar_div(...)``). The real
one converts between the Python and C++ tensor types and records the source location; pypto_lab
has one tensor type and records locations itself, so the wrapper only keeps the function's name
and docstring.
"""

from __future__ import annotations

import functools


def op_wrapper(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper


__all__ = ["op_wrapper"]
