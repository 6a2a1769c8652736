"""Whether an attention is causal: ``is_causal=True``, or an attention mask the graph builds from
positions so that query ``i`` sees the keys up to its own position.

transformers builds the causal mask of its SDPA attention in the model's graph rather than passing
``is_causal``: two index vectors from ``arange`` (the keys' positions along the last axis, the
queries' along the one before), compared ``kv <= q`` and broadcast to the scores' shape. The
mask's producer is followed through views, broadcasts, casts and an ``and`` with other masks (a
padding mask) to that comparison; its operands must come from ``arange`` with no model input or
parameter on the way, so a mask that depends on data is never taken for causal.
"""

from __future__ import annotations

from ..capture.graph import Graph, Node

# ops a mask passes through unchanged in meaning
_THROUGH = {"expand", "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "to", "_to_copy", "clone",
            "alias", "contiguous", "expand_copy", "permute", "slice", "select", "detach", "lift_fresh_copy"}
_AND = {"logical_and", "__and__", "bitwise_and", "mul"}
# index arithmetic between an arange and a comparison
_INDEX = _THROUGH | {"add", "sub", "arange"}
SDPA_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention")


def _producer(graph: Graph, name: str) -> Node | None:
    return graph.producers().get(name)


def _from_arange(graph: Graph, name: str, depth: int = 0) -> bool:
    """``name`` is computed from ``arange`` by index arithmetic only (no input, no parameter)."""
    node = _producer(graph, name)
    if node is None or depth > 12 or node.op not in _INDEX:
        return False
    if node.op == "arange":
        return True
    tensors = [i for i in node.inputs if _producer(graph, i) is not None or graph.info(i) is not None]
    return bool(tensors) and all(_from_arange(graph, i, depth + 1) for i in tensors)


def _varies_along(shape: tuple[int, ...], axis: int) -> bool:
    """A broadcastable index vector that has extent only along ``axis`` (-1 keys, -2 queries)."""
    if len(shape) < 2:
        return axis == -1 and len(shape) == 1
    return all(s == 1 for i, s in enumerate(shape) if i != len(shape) + axis) and shape[axis] >= 1


def mask_is_causal(graph: Graph, name: str, depth: int = 0) -> bool:
    """Whether the mask tensor ``name`` lets query ``i`` see exactly the keys up to its position."""
    node = _producer(graph, name)
    if node is None or depth > 12:
        return False
    if node.op in _THROUGH and node.inputs:
        return mask_is_causal(graph, node.inputs[0], depth + 1)
    if node.op in _AND and len(node.inputs) == 2:
        return any(mask_is_causal(graph, i, depth + 1) for i in node.inputs)
    if node.op in ("le", "ge", "lt", "gt") and len(node.inputs) == 2:
        a, b = (graph.info(i) for i in node.inputs)
        if a is None or b is None:
            return False
        kv, q = (node.inputs[0], node.inputs[1]) if node.op in ("le", "lt") else (node.inputs[1], node.inputs[0])
        kv_shape, q_shape = (a.shape, b.shape) if node.op in ("le", "lt") else (b.shape, a.shape)
        return (_varies_along(kv_shape, -1) and _varies_along(q_shape, -2)
                and _from_arange(graph, kv) and _from_arange(graph, q))
    return False


def attention_is_causal(graph: Graph, node: Node) -> bool:
    """An SDPA node asked for causal attention, by ``is_causal`` or by a causal mask."""
    op, args, kwargs = node.op, node.args, node.kwargs
    if op == "_scaled_dot_product_flash_attention_for_cpu":
        causal, mask = (args[4] if len(args) > 4 else kwargs.get("is_causal", False)), kwargs.get("attn_mask")
    else:
        causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    if causal is True:
        return True
    return isinstance(mask, str) and mask in node.inputs and mask_is_causal(graph, mask)


__all__ = ["SDPA_OPS", "attention_is_causal", "mask_is_causal"]
