"""The graph verifier: the invariants every pass must keep, checked after each pass in the tests
and when ``PYPTO_LAB_VERIFY=1`` (the `Verify` instrument), as torch.fx's
``run_checks_after_each_pass`` and PyPTO's PostCheck do.

* every node and value has one name, and every input a node reads is defined before it;
* every graph output is defined;
* shapes and dtypes are present: every node that another node or the graph output reads has
  its outputs, with integer dimensions >= 0 and a dtype;
* after `map_ops`: every node is mapped, and every node is in exactly one kernel: a view outside
  any group in none, every other node either anchors its own kernel (it has a spec) or belongs
  to a group whose anchor is in the group and has the spec; members carry no spec of their own.
"""

from __future__ import annotations

from ..capture.graph import Graph


class GraphError(ValueError):
    """A pass left the graph inconsistent: the message names the pass, the node and the rule broken."""


def verify(graph: Graph, after: str = "") -> None:
    """Raise `GraphError` at the first broken invariant (see the module docstring)."""
    where = f"after pass {after!r}: " if after else ""

    def fail(msg: str) -> GraphError:
        return GraphError(where + msg)

    defined = set(graph.values)
    read: set[str] = set(graph.outputs)
    for n in graph.nodes:
        read.update(n.inputs)
    nodes = {}
    for n in graph.nodes:
        if n.name in defined:
            raise fail(f"node {n.name!r} reuses a name already defined; names must be unique")
        for i in n.inputs:
            if i not in defined:
                raise fail(f"node {n.name!r} ({n.target}) reads {i!r} before it is defined: every input must be a "
                           "graph value or an earlier node (keep the node list in topological order)")
        if n.name in read and not n.outputs and n.unit not in ("free", "cpu", None):
            raise fail(f"node {n.name!r} ({n.target}) is read but has no output shape and dtype")
        for info in n.outputs:
            if not isinstance(info.dtype, str) or not info.dtype or \
                    not all(isinstance(d, int) and d >= 0 for d in info.shape):
                raise fail(f"node {n.name!r} has an output without a static shape and dtype: {info!r}")
        defined.add(n.name)
        nodes[n.name] = n
    for o in graph.outputs:
        if o not in defined:
            raise fail(f"graph output {o!r} is not defined by any value or node")
    if not any(n.npu is not None for n in graph.nodes):
        return  # not mapped yet: no kernels to check
    for n in graph.nodes:
        if n.npu is None:
            raise fail(f"node {n.name!r} ({n.target}) has no catalogue entry: run map_ops over the whole graph")
        if n.group is not None:
            anchor = nodes.get(n.group)
            if anchor is None:
                raise fail(f"node {n.name!r} belongs to group {n.group!r}, which is not a node of the graph")
            if anchor.group != anchor.name:
                raise fail(f"node {n.name!r} belongs to group {n.group!r}, but that node is not in its own group "
                           "(a group's anchor must be one of its members)")
            if anchor.kernel is None:
                raise fail(f"group {n.group!r} has no kernel spec on its anchor")
            if n is not anchor and n.kernel is not None:
                raise fail(f"node {n.name!r} is a member of group {n.group!r} but carries a spec of its own; a "
                           "kernel's spec lives on its anchor only")
        elif n.unit == "free":
            if n.kernel is not None:
                raise fail(f"view {n.name!r} ({n.target}) outside any group carries a kernel spec; views run no kernel")
        elif n.kernel is None:
            raise fail(f"node {n.name!r} ({n.target}, unit {n.unit}) is in no kernel: it has no spec and no group")


__all__ = ["GraphError", "verify"]
