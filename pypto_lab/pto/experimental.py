"""``pypto.experimental``: the real framework's experimental namespace (python/pypto/experimental
at 883e7df), as far as pypto_lab models it.

* ``set_operation_options(combine_axis=...)`` / ``get_operation_options()``: checked and recorded
  (option_table).
* ``transposed_batchmatmul(a (M, B, K), b (B, K, N), out_dtype)``: ``(a.transpose(0, 1) @ b)
  .transpose(0, 1)``, traced as those three ops (a transpose on the Vector unit each side of a
  batched matmul; the real op reads and writes the (M, B, ...) layout with strided moves instead,
  so its cost here is an upper bound).
* ``gather_in_ub`` / ``gather_in_l1``: the paged-attention token gathers (`ops_index`).
* ``online_softmax(scores, scale)`` / ``online_softmax_update(...)``: the block-wise softmax of
  the docs, column statistics over axis 0, written as the recorded ops they are made of (VMULS, a
  column max, VSUB, VEXP, a column sum, a cast to bf16; the update's maximum, exps and FMAs).
* ``nop``, ``shmem_load``, ``shmem_store``: names of the real namespace that pypto_lab does not
  model yet; calling one raises `NotModelledError`.
"""

from __future__ import annotations

from . import ops
from .config import get_operation_options, set_operation_options
from .errors import NotModelledError, ShapeError
from .ops_index import gather_in_l1, gather_in_ub

NOT_MODELLED = ("nop", "shmem_load", "shmem_store")


def online_softmax(scores, scale):
    """(exp(scores * scale - column max) as DT_BF16, the column max [1, q], the column sum [1, q]):
    the statistics of one block of a block-wise softmax over axis 0 (docs/zh/api/operation/
    pypto-experimental-online_softmax.md)."""
    from .dtypes import DT_BF16, DT_FP32

    x = ops._tensor(scores, "online_softmax")
    if x.ndim != 2:
        raise ShapeError(f"experimental.online_softmax: scores of shape {x.shape}. Rule: [kv_len, q_len]")
    s = ops.mul(ops.cast(x, DT_FP32) if x.dtype is not DT_FP32 else x, float(scale))
    m = ops.amax(s, 0, True)
    e = ops.exp(ops.sub(s, m))
    return ops.cast(e, DT_BF16), m, ops.sum(e, 0, True)


def online_softmax_update(previous_max, previous_sum, previous_output, current_max, current_sum, current_output):
    """Merge a block's (max, sum, unnormalised output) into the running ones: ``m = max(pm, cm)``,
    ``s = ps * exp(pm - m) + cs * exp(cm - m)``, ``o = po * exp(pm - m) + co * exp(cm - m)``."""
    m = ops.maximum(previous_max, current_max)
    a = ops.exp(ops.sub(previous_max, m))
    b = ops.exp(ops.sub(current_max, m))
    s_new = ops.add(ops.mul(previous_sum, a), ops.mul(current_sum, b))
    o_new = ops.add(ops.mul(previous_output, a), ops.mul(current_output, b))
    return m, s_new, o_new


def transposed_batchmatmul(tensor_a, tensor_b, out_dtype):
    """(M, B, K) x (B, K, N) -> (M, B, N): a batched matmul over the middle axis of ``tensor_a``."""
    a, b = ops._tensor(tensor_a, "transposed_batchmatmul"), ops._tensor(tensor_b, "transposed_batchmatmul")
    if a.ndim != 3 or b.ndim != 3 or a.shape[1] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ShapeError(f"experimental.transposed_batchmatmul: shapes {list(a.shape)} and {list(b.shape)}. Rule: "
                         "tensor_a is (M, B, K) and tensor_b (B, K, N) with the same B and K. Fix: transpose or "
                         "reshape the operands to those layouts")
    from . import config
    from .tiling import suggest_vec_tile

    saved = config.STATE.vec_tile
    try:   # the transposes are this op's own data movement: tiled by a legal tile, not the caller's
        config.STATE.vec_tile = suggest_vec_tile([a.shape[1], a.shape[0], a.shape[2]], a.dtype)
        at = ops.transpose(a, 0, 1)
        config.STATE.vec_tile = saved
        out = ops.matmul(at, b, out_dtype)
        config.STATE.vec_tile = suggest_vec_tile([out.shape[1], out.shape[0], out.shape[2]], out.dtype)
        return ops.transpose(out, 0, 1)
    finally:
        config.STATE.vec_tile = saved


def _not_modelled(name: str):
    def op(*args, **kwargs):
        raise NotModelledError(
            f"pypto.experimental.{name}: pypto_lab does not model this experimental op of the real framework yet. "
            f"Rule: the modelled experimental names are transposed_batchmatmul, gather_in_ub, gather_in_l1, "
            f"online_softmax, online_softmax_update, set_operation_options and get_operation_options. Fix: write it with the modelled ops (e.g. amax/exp/sum for online_softmax), "
            "or run this kernel on the real framework")
    op.__name__ = op.__qualname__ = name
    op.__doc__ = "Not modelled by pypto_lab: raises NotModelledError."
    return op


for _name in NOT_MODELLED:
    globals()[_name] = _not_modelled(_name)

__all__ = ["set_operation_options", "get_operation_options", "transposed_batchmatmul", "gather_in_ub", "gather_in_l1",
           "online_softmax", "online_softmax_update", *NOT_MODELLED]
