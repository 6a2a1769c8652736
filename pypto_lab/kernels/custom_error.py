"""`CustomOpError`, the error of user operators: shared by `custom` (registration, lowering,
declared costs) and `pto_bridge` (pto kernels as their NPU implementation)."""


class CustomOpError(ValueError):
    """A custom operator cannot be registered or costed: the message names the rule and the fix."""


__all__ = ["CustomOpError"]
