"""What issue 3 asks the whole-model path to show, checked on every model, batch, chip and level.

Run:  .venv/bin/python benchmarks/model_matrix.py   (a few minutes; prints a Markdown table)

For ResNet-50 (batch 1 and 32) and BERT-base (batch 1 and 8, sequence 128) on Ascend910A and
Ascend910B1, at levels 0-3: latency, kernels, CPU fallbacks, how many convolutions carry their
BatchNorm folded and how many ReLUs and residual adds ride in a convolution's kernel, how many attentions are one fused kernel, and whether level 3 beats level 0.
"""

from __future__ import annotations

from pypto_lab import optimize
from pypto_lab.kernels.ir import AttentionKernel
from pypto_lab.models.zoo import bert_base, resnet50


def conv_bn_relu(om) -> str:
    """Convolutions with their BatchNorm folded; ReLUs and residual adds inside a convolution's kernel."""
    convs = [n for n in om.graph.nodes if n.op == "conv2d"]
    if not convs:
        return "-"
    conv_groups = {n.group for n in convs} - {None}
    relus = [n for n in om.graph.nodes if n.op in ("relu", "relu_")]
    adds = [n for n in om.graph.nodes if n.op in ("add", "add_") and n.unit == "vector"]
    fused = lambda ns: sum(n.group in conv_groups for n in ns)  # noqa: E731
    return (f"BN {sum(n.folded_bn is not None for n in convs)}/{len(convs)}, "
            f"ReLU {fused(relus)}/{len(relus)}, add {fused(adds)}/{len(adds)}")


def fused_attention(om) -> int:
    return sum(1 for n in om.graph.nodes if isinstance(n.kernel, AttentionKernel) and n.kernel.flash)


def main() -> None:
    cases = [("ResNet-50", 1, resnet50(batch=1)), ("ResNet-50", 32, resnet50(batch=32)),
             ("BERT-base s128", 1, bert_base(batch=1)), ("BERT-base s128", 8, bert_base(batch=8))]
    print("| model | batch | chip | level 0 us | level 1 us | level 2 us | level 3 us | L0/L3 | kernels L0->L3 "
          "| fallbacks | in conv kernels (L1) | fused attention (L1) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for label, batch, (model, inputs) in cases:
        for chip in ("Ascend910A", "Ascend910B1"):
            oms = {lv: optimize(model, inputs, chip=chip, level=lv) for lv in range(4)}
            reps = {lv: om.report() for lv, om in oms.items()}
            fallbacks = max(len(r.fallback_ops) for r in reps.values())
            lat = [reps[lv].latency_us for lv in range(4)]
            print(f"| {label} | {batch} | {chip} | " + " | ".join(f"{v:,.0f}" for v in lat)
                  + f" | {lat[0] / lat[3]:.2f}x | {len(reps[0].kernels)} -> {len(reps[3].kernels)} | {fallbacks} "
                  f"| {conv_bn_relu(oms[1])} | {fused_attention(oms[1])} |")


if __name__ == "__main__":
    main()
