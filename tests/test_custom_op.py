"""pypto_lab.custom_ops: the seed article's @custom_op, captured, costed, simulated and run."""

import pytest
import torch

import pypto_lab
from pypto_lab.lowering.custom_ops import CustomOpError, custom_op
from pypto_lab.lowering.table import lookup

custom_op_impl = """
#include "tbe/te_operation.h"
using namespace tbe;
TE_IMPLEMET(my_custom_op) { /* NPU side */ }
"""


# the seed article's example, section 4.2, with only the import adapted
@custom_op(npu_func=custom_op_impl)
def my_custom_op(input):
    return input * 2


@custom_op(flops=lambda x: x.numel(), bytes=lambda x: 2 * x.numel() * x.element_size())
def co_scale(x):
    return x * 3


@custom_op(unit="cube", flops=lambda x: 2 * x.shape[0] * x.shape[1] * 64)
def co_project(x):
    return x[:, :64] * 1.0


@custom_op(cost=lambda x, chip: 7.5)
def co_fixed(x):
    return x + 1


class _Uses(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + 1


def test_seed_example_registers_and_runs():
    assert torch.equal(my_custom_op(torch.ones(3)), torch.full((3,), 2.0))
    entry = lookup("pypto_lab_user.my_custom_op.default")
    assert entry is not None and entry.unit == "vector"
    assert "TE_IMPLEMET" in my_custom_op.pypto_spec.npu_source
    graph = pypto_lab.capture(_Uses(my_custom_op), torch.randn(4, 8))
    assert [n.target for n in graph.nodes].count("pypto_lab_user.my_custom_op.default") == 1


@custom_op()
def co_qr(x):
    return torch.linalg.qr(x).Q   # a QR factorisation: no Vector operator does it


def test_op_without_a_declared_cost_is_costed_from_its_reference():
    # the seed's op declares no cost: its reference (x * 2) is one element-wise multiply on the Vector unit
    rep = pypto_lab.optimize(_Uses(my_custom_op), torch.randn(64, 1024), chip="Ascend910B1", level=0).report()
    k = next(k for k in rep.kernels if k.name.startswith("my_custom_op"))
    assert k.unit == "vector" and k.time_us > 0 and "cost from its reference: mul" in k.spec.op
    assert k.spec.ops == ("mul",)
    assert rep.fallback_ops == []


def test_op_without_cost_and_an_untraceable_reference_is_a_clear_error():
    with pytest.raises(CustomOpError, match="custom op 'co_qr' has no cost.*flops=.*bytes=.*cost=.*linalg_qr"):
        pypto_lab.optimize(_Uses(co_qr), torch.randn(8, 8), chip="Ascend910B1", level=1)


def test_vector_op_is_simulated_not_a_fallback():
    model = _Uses(co_scale)
    om = pypto_lab.optimize(model, torch.randn(64, 128), chip="Ascend910B1", level=1)
    report = om.report()
    assert not report.fallback_ops
    k = next(k for k in report.kernels if k.name.startswith("co_scale"))
    assert k.unit == "vector" and k.time_us > 0 and k.reports
    assert k.gm_bytes == pytest.approx(2 * 64 * 128 * 2)  # fp16 in GM: read and write once
    x = torch.randn(3, 5)
    assert torch.allclose(model(x), x * 3 + 1)


def test_cube_op_is_a_matmul_of_its_flops():
    om = pypto_lab.optimize(_Uses(co_project), torch.randn(256, 128), chip="Ascend910B1", level=1)
    k = next(k for k in om.report().kernels if k.name.startswith("co_project"))
    assert k.unit == "cube"
    assert k.reports[0].shape == {"m": 256, "k": 128, "n": 64, "batch": 1, "epilogue": "none"}


def test_cost_function_gives_the_time():
    om = pypto_lab.optimize(_Uses(co_fixed), torch.randn(8, 16), chip="Ascend910A", level=1)
    k = next(k for k in om.report().kernels if k.name.startswith("co_fixed"))
    assert k.time_us == pytest.approx(7.5)


def test_registering_again_replaces_the_reference():
    @custom_op(bytes=64, name="co_again")
    def first(x):
        return x + 1

    @custom_op(bytes=64, name="co_again")
    def second(x):
        return x + 2

    assert torch.equal(first(torch.zeros(2)), torch.full((2,), 2.0))
    with pytest.raises(CustomOpError, match="already registered with schema"):
        @custom_op(bytes=64, name="co_again")
        def third(x, y):
            return x + y


@pytest.mark.parametrize("kwargs, match", [
    ({"unit": "gpu"}, "unit = 'gpu' is not known; choose one of vector, cube, move"),
    ({"flops": -1}, "flops = -1: must be a number >= 0"),
    ({"unit": "cube"}, "on the Cube needs flops="),
    ({"cost": 3.0}, "cost = 3.0: must be a function"),
    ({"name": "bad name"}, "must be a Python identifier"),
    ({"npu_func": 42}, "npu_func = 42"),
])
def test_bad_registration(kwargs, match):
    with pytest.raises(CustomOpError, match=match):
        @custom_op(**kwargs)
        def co_bad(x):
            return x
