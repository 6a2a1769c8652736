"""Find where an optimised model's numerics go wrong: compare every layer with the fp32 reference.

``compare_layers(model, optimized, inputs)`` runs the captured program twice, once in plain
torch (fp32, the reference) and once with the NPU's numerics (`pypto_lab.runtime`), and compares
every node's value, in graph order, with `compare_tensors`. Two comparisons per node:

* ``accumulated``: the optimised run's value against the reference's: what the model really
  computes at that point, with every error of the layers before it;
* ``local``: the node's NPU numerics applied to the *reference* inputs: the node's own error
  alone. An error that appears in one layer and spreads to all later ones fails ``accumulated``
  everywhere after it, but ``local`` only where it is made: `LayerComparisons.first_failure`
  (local by default) names that layer.

A convolution with a BatchNorm folded in is compared with the BatchNorm's output (what it now
computes); views and nodes the optimised graph removed are skipped. ``hook(node_name, value)``
(return a tensor to replace the value, or None) changes values in the optimised run only: use it
to see how an error in one layer propagates, or to check that the tool finds it.

By default each layer's absolute tolerance scales with that layer (``atol`` times the largest
|value| of the reference), because intermediate values of a network differ in scale by orders of
magnitude; pass ``relative_atol=False`` for plain absolute tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..capture.catalogue import aten_name
from ..compiler.optimize import OptimizedModel
from ..files.progress import progress
from ..runtime.compare import CompareError, Comparison, compare_tensors
from ..runtime.interpreter import Hook


@dataclass
class LayerComparison:
    """One node of the optimised graph against the reference."""

    index: int
    name: str               # node name (same in the exported program and the project Graph)
    module: str             # module path, e.g. "layer1.0.conv1"
    op: str                 # ATen op, e.g. "conv2d"
    kernel: str             # the fused kernel it belongs to (its group's anchor) or its own name
    accumulated: Comparison
    local: Comparison
    reference_node: str     # the reference node compared with (the BN's, for a folded conv)

    @property
    def layer(self) -> str:
        return f"{self.module or '(model)'} {self.op}"

    def passed(self, local: bool = True) -> bool:
        return (self.local if local else self.accumulated).passed


class LayerComparisons(list):
    """`LayerComparison`s in graph order, with helpers to find and show the failures."""

    def first_failure(self, local: bool = True) -> LayerComparison | None:
        """The first layer whose own error (``local``) or accumulated error fails, or None."""
        return next((c for c in self if not c.passed(local)), None)

    def failures(self, local: bool = True) -> list[LayerComparison]:
        return [c for c in self if not c.passed(local)]

    def table(self, only_failures: bool = False) -> str:
        rows = [c for c in self if not (only_failures and c.passed() and c.passed(False))]
        width = max([len(c.layer) for c in rows] + [5])
        lines = [f"{'#':>4}  {'layer':<{width}}  {'node':<24}  {'local max err':>13}  {'local cos':>10}  "
                 f"{'acc max err':>11}  {'acc cos':>10}  verdict"]
        for c in rows:
            verdict = ("ok" if c.passed() else "FAILS HERE") + ("" if c.passed(False) else " (accumulated fails)")
            lines.append(f"{c.index:>4}  {c.layer:<{width}}  {c.name:<24}  {c.local.max_abs_error:13.3e}  "
                         f"{c.local.cosine_similarity:10.6f}  {c.accumulated.max_abs_error:11.3e}  "
                         f"{c.accumulated.cosine_similarity:10.6f}  {verdict}")
        first = self.first_failure()
        lines.append(f"first layer failing on its own: {first.layer} ({first.name})" if first
                     else "every layer passes on its own")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)][:1]
    return []


def compare_layers(model: torch.nn.Module, optimized, inputs, rtol: float = 1e-2, atol: float = 1e-2,
                   relative_atol: bool = True, hook: Hook | None = None) -> LayerComparisons:
    """Every computing node of ``optimized`` (from ``pypto_lab.optimize(model, ...)``) on ``inputs``
    against the plain fp32 run of the same captured program, in graph order."""
    if not isinstance(optimized, OptimizedModel):
        raise CompareError(f"optimized must be what pypto_lab.optimize returns: got {type(optimized).__name__}; "
                           "call optimized = pypto_lab.optimize(model, example_inputs, ...) first")
    if optimized.model is not model:
        raise CompareError("model is not the module optimized was built from; pass the same model object "
                           f"(optimized.model is a {type(optimized.model).__name__})")
    compare_tensors(torch.zeros(1), torch.zeros(1), rtol=rtol, atol=atol, verbose=False)  # checks the tolerances
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    rt = optimized.runtime
    # three runs of the whole program on the CPU: a bar once they take more than two seconds
    steps = progress(total=3, desc="compare_layers: reference, NPU numerics, each layer alone", unit="run",
                     delay=2.0, leave=False)
    reference: dict[str, Any] = {}
    rt.reference(args, record=reference)
    steps.update(1)
    npu: dict[str, Any] = {}
    rt.run(args, hook=hook, record=npu)
    steps.update(1)
    local = rt.local(args, reference, hook=hook)
    steps.update(1)
    steps.close()
    folded_ref = _folded_reference(rt)
    results = LayerComparisons()
    for gnode in _graph_order(rt):
        if gnode.unit == "free" or gnode.name not in npu:
            continue
        ref_name = folded_ref.get(gnode.name, gnode.name)
        got, want, own = _tensors(npu[gnode.name]), _tensors(reference.get(ref_name)), _tensors(local[gnode.name])
        if not got or not want or not own or not want[0].is_floating_point() or got[0].shape != want[0].shape:
            continue
        tol = atol * float(want[0].abs().max()) if relative_atol and want[0].numel() else atol
        results.append(LayerComparison(
            index=len(results), name=gnode.name, module=gnode.module, op=aten_name(gnode.target),
            kernel=gnode.anchor,
            accumulated=compare_tensors(got[0], want[0], rtol=rtol, atol=tol, verbose=False),
            local=compare_tensors(own[0], want[0], rtol=rtol, atol=tol, verbose=False),
            reference_node=ref_name))
    return results


def _graph_order(rt) -> list:
    """Project-graph nodes in the exported program's order (level 3 may reorder the graph)."""
    by_name = rt.graph.producers()
    return [by_name[n.name] for n in rt.ep.graph.nodes if n.name in by_name]


def _folded_reference(rt) -> dict[str, str]:
    """conv node -> the reference node holding conv + BN (the BN, or its getitem 0)."""
    out = {}
    for g in rt.graph.nodes:
        bn = g.folded_bn.bn if g.folded_bn is not None else None
        if not bn or bn not in rt.fx_nodes:
            continue
        target = bn
        for user in rt.fx_nodes[bn].users:
            if "getitem" in str(user.target) and len(user.args) > 1 and user.args[1] == 0:
                target = user.name
        out[g.name] = target
    return out


__all__ = ["LayerComparison", "LayerComparisons", "compare_layers"]
