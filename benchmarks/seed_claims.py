"""The seed articles' claims next to the simulator's own figures.

Run:  .venv/bin/python benchmarks/seed_claims.py   (about a minute; prints a Markdown table)

Every figure is computed here from `pypto_lab.optimize` reports; the claims are quoted from the
seed article (shared/seeds/000_*, summarised in its README) and are the article's, not ours.
"""

from __future__ import annotations

from pypto_lab import optimize
from pypto_lab.models.zoo import bert_base, resnet50


def pct(new: float, old: float) -> str:
    return f"{100 * (new - old) / old:+.0f} %"


def step(report, name: str):
    return next(p for p in report.passes if p.name == name)


def main() -> None:
    rows = []
    model, (x,) = resnet50(batch=32)
    for chip in ("Ascend910A", "Ascend910B1"):
        l0 = optimize(model, x, chip=chip, level=0).report()
        l1 = optimize(model, x, chip=chip, level=1).report()
        l2 = optimize(model, x, chip=chip, level=2).report()
        l3 = optimize(model, x, chip=chip, level=3).report()
        before, after = step(l1, "decompose").gm_bytes, step(l1, "fuse_conv_bn_relu").gm_bytes
        rows.append(("Conv+BN+ReLU fusion cuts memory access ~40 %",
                     f"ResNet-50 b32 {chip}: GM bytes before / after fold_batchnorm + fuse_conv_bn_relu (same tiling)",
                     pct(after, before)))
        rows.append(("ResNet-50 optimised 2.6x (8.3 -> 3.2 ms)", f"ResNet-50 b32 {chip}: level 0 / level 3",
                     f"{l0.latency_us / l3.latency_us:.2f}x ({l0.latency_us / 1e3:.2f} -> {l3.latency_us / 1e3:.2f} ms)"))
        rows.append(("memory reuse cuts peak memory ~35 %", f"ResNet-50 b32 {chip} level 2: peak GM with / without reuse",
                     pct(l2.memory.peak_bytes_reuse, l2.memory.peak_bytes_no_reuse)))
    chip = "Ascend910B1"
    f32 = optimize(model, x, chip=chip, level=3, precision="fp32").report()
    f16 = optimize(model, x, chip=chip, level=3, precision="fp16").report()
    i8 = optimize(model, x, chip=chip, level=3, precision="int8").report()
    rows.append(("fp16 is 1.5-2x faster than fp32", f"ResNet-50 b32 {chip} level 3: fp32 / fp16",
                 f"{f32.latency_us / f16.latency_us:.2f}x"))
    rows.append(("(int8 quantisation, no figure claimed)", f"ResNet-50 b32 {chip} level 3: fp16 / int8",
                 f"{f16.latency_us / i8.latency_us:.2f}x"))
    bert, (ids,) = bert_base(batch=8, seq=128)
    for chip in ("Ascend910A", "Ascend910B1"):
        b0 = optimize(bert, (ids,), chip=chip, level=0).report()
        b1 = optimize(bert, (ids,), chip=chip, level=1).report()
        b3 = optimize(bert, (ids,), chip=chip, level=3).report()
        ln0 = sum(k.time_us for k in b0.kernels if k.name.startswith("LayerNorm."))
        ln1 = sum(k.time_us for k in b1.kernels if "aten.layer_norm.default" in k.fused_ops)
        rows.append(("fused LayerNorm 5x", f"BERT-base b8 s128 {chip}: 8 primitive kernels / fused (incl. residual add)",
                     f"{ln0 / ln1:.2f}x"))
        rows.append(("(BERT end to end)", f"BERT-base b8 s128 {chip}: level 0 / level 3",
                     f"{b0.latency_us / b3.latency_us:.2f}x ({b0.latency_us / 1e3:.2f} -> {b3.latency_us / 1e3:.2f} ms)"))
    print("| seed article's claim | simulator measurement | simulator's figure |")
    print("|---|---|---|")
    for claim, what, value in rows:
        print(f"| {claim} | {what} | {value} |")


if __name__ == "__main__":
    main()
