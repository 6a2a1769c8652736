"""L2 fusion by batch slices (fusion ``l2_batch_split``, `pypto_lab.compiler.batch_split`): a
batch whose activations overflow the 310P3's 16 MB L2 runs in slices whose activations stay in L2."""

import torch

from pypto_lab.compiler.batch_split import FUSION, slice_inputs, slices_of, spills
from pypto_lab.compiler.optimize import optimize
from pypto_lab.stack import get_stack
from pypto_lab.validation.inference_rows import mechanisms_of

CHIP = "Ascend310P3"


def convs() -> torch.nn.Module:
    """Three 3x3 convolutions with ReLU on 64 channels: 56 x 56 x 64 fp16 is 0.4 MB per sample."""
    layers = []
    for _ in range(3):
        layers += [torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


def test_slices_halve_the_batch_while_it_divides():
    assert slices_of(64) == [32, 16, 8, 4, 2, 1]
    assert slices_of(12) == [6, 3]
    assert slices_of(1) == [] and slices_of(7) == []


def test_inputs_without_the_batch_first_are_not_split():
    x = torch.zeros(8, 3)
    assert [t.shape[0] for t in slice_inputs((x, x), 8, 2)] == [2, 2]
    assert slice_inputs((x, torch.zeros(3, 8)), 8, 2) is None


def test_a_batch_overflowing_l2_runs_in_slices_that_stay_in_l2():
    # batch 64: each activation is 25.7 MB (> 16 MB L2) and crosses DRAM; a slice of 8 holds 3.2 MB
    model, x = convs(), torch.randn(64, 64, 56, 56)
    atc = get_stack("atc-om")
    assert atc.applies(FUSION)
    split = optimize(model, x, chip=CHIP, level=3, precision="fp16", stack=atc).report()
    whole = optimize(model, x, chip=CHIP, level=3, precision="fp16",
                     stack=atc.with_values(fusions=sorted(atc.fusions - {FUSION}))).report()
    assert any("slices of" in n and FUSION in n for n in split.notes)
    assert split.passes[-1].name == FUSION
    assert split.latency_us < whole.latency_us
    assert split.dram_bytes < 0.5 * whole.dram_bytes      # the activations between the convs stay on chip
    assert split.batch == 64
    slices = split.kernels[0].count
    assert slices > 1 and 64 % slices == 0
    assert len(split.schedule.kernels) == slices * len(split.kernels)
    assert abs(split.energy().macs - whole.energy().macs) < 1e-6 * whole.energy().macs  # every slice's MACs
    named = mechanisms_of(split)                          # what a validation row names
    assert "slices of" in named[0] and any("stay in L2" in m for m in named[1:])


def test_a_batch_that_fits_l2_is_not_split():
    model, x = convs(), torch.randn(2, 64, 56, 56)
    rep = optimize(model, x, chip=CHIP, level=3, precision="fp16", stack="atc-om").report()
    assert not any(FUSION in n for n in rep.notes)
    assert all(k.count == 1 for k in rep.kernels)


def test_a_stack_without_l2_optimisation_does_not_split():
    # torch_aie lists no l2_optimize, nor its batch split
    model, x = convs(), torch.randn(64, 64, 56, 56)
    assert not get_stack("torch_aie").applies(FUSION)
    rep = optimize(model, x, chip=CHIP, level=3, precision="fp16", stack="torch_aie").report()
    assert not any(FUSION in n for n in rep.notes)


def test_the_split_is_tried_only_where_activations_spill_from_l2():
    atc = get_stack("atc-om")
    whole = atc.with_values(fusions=sorted(atc.fusions - {FUSION}))
    for batch, spilled in ((64, True), (2, False)):   # 25.7 MB per activation against 0.8 MB
        opt = optimize(convs(), torch.randn(batch, 64, 56, 56), chip=CHIP, level=3, precision="fp16", stack=whole)
        assert spills(opt.graph, opt.chip, opt.cube_precision) is spilled


def test_recosting_a_split_report_says_the_slices_are_not_redone():
    from pypto_lab.compiler.optimize import recost
    opt = optimize(convs(), torch.randn(64, 64, 56, 56), chip=CHIP, level=3, precision="fp16", stack="atc-om")
    again = recost(opt.report(), opt.graph, "auto_tune", "retiled")
    assert f"without the {FUSION} slices" in again.notes[-1]
    assert all(k.count == 1 for k in again.kernels)


def test_no_split_is_tried_where_the_weights_outweigh_what_spills():
    """Weights that stream through L2 push out small activations, but two slices would read 64 MB of
    weights again to keep a few hundred KB out of DRAM: no slice can move fewer bytes, none is tried."""
    from pypto_lab.compiler.batch_split import spilled_traffic, weight_bytes
    from pypto_lab.hw.chip import get_chip
    from pypto_lab.hw.l2_residency import plan_l2
    from pypto_lab.lowering.lower import kernels_of, storage_dtypes
    from pypto_lab.passes.l2_residency import kernel_steps

    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                                torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).eval()
    x = torch.randn(8, 4096)
    whole = optimize(model, x, chip=CHIP, level=2, precision="fp16", stack=get_stack("atc-om"))
    chip = get_chip(CHIP)
    steps, outputs = kernel_steps(whole.graph, kernels_of(whole.graph), storage_dtypes(chip, "fp16")[1])
    spilled = {n for n in plan_l2(steps, int(chip.l2_bytes), outputs).spilled if n not in outputs}
    assert spilled                                  # the weights did push activations out of L2
    assert spilled_traffic(steps, spilled) < weight_bytes(whole.graph, steps) == 3 * 4096 * 4096 * 2 + 3 * 4096 * 2
    assert not spills(whole.graph, chip, "fp16")
    assert all(p.name != FUSION for p in whole.report().passes)
