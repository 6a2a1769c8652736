"""pypto_lab.memory: the memory-pool switches and allocators change the planned peak GM memory."""

import pytest
import torch
import torchvision

import pypto_lab
from pypto_lab.analysis.memory_plan import caching_block
from pypto_lab.session import memory


@pytest.fixture(autouse=True)
def _defaults():
    memory.reset_memory()
    yield
    memory.reset_memory()


@pytest.fixture(scope="module")
def resnet18():
    return torchvision.models.resnet18().eval(), torch.randn(16, 3, 224, 224)


def _peak(model, x, level=1):
    r = pypto_lab.optimize(model, x, chip="Ascend910B1", level=level).report()
    return r.peak_memory_bytes, r


def test_pool_and_allocators_change_the_peak_the_expected_way(resnet18):
    model, x = resnet18
    by_level, r = _peak(model, x)                       # level 1, nothing set: no reuse
    assert r.memory.allocator == "naive"
    memory.enable_memory_pool()                         # unified by default: best-fit reuse
    unified, r = _peak(model, x)
    assert r.memory.allocator == "unified" and unified == r.memory.peak_bytes_reuse
    memory.set_memory_allocator("caching")
    caching, r = _peak(model, x)
    assert "caching allocator" in r.memory.summary()
    memory.set_memory_allocator("naive")
    naive, _ = _peak(model, x)
    assert unified < caching < naive == by_level        # 2 MiB rounding costs, reuse saves more
    assert unified < 0.7 * naive
    memory.set_memory_allocator("unified")
    memory.disable_memory_pool()
    off, r2 = _peak(model, x, level=2)                  # off: no reuse even at level 2
    assert off == r2.memory.peak_bytes_no_reuse and r2.memory.allocator == "naive"
    memory.reset_memory()
    on, r2 = _peak(model, x, level=2)                   # back to reuse from level 2 on
    assert on == r2.memory.peak_bytes_reuse < off and r2.memory.allocator == "unified"
    assert r.to_dict()["peak_memory_bytes"] == r.memory.peak_bytes


def test_caching_allocator_rounds_and_reuses_whole_blocks():
    assert caching_block(1) == 512 and caching_block(1 << 20) == 1 << 20
    assert caching_block((1 << 20) + 1) == 2 << 20 and caching_block(5 << 20) == 6 << 20
    # tiny model: everything small, so the caching plan is the naive one or better
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    memory.enable_memory_pool()
    memory.set_memory_allocator("caching")
    plan = pypto_lab.optimize(model, torch.randn(8, 64), chip="Ascend910B1").report().memory
    assert plan.peak_bytes_reuse <= plan.peak_bytes == plan.peak_bytes_caching <= plan.peak_bytes_no_reuse


def test_unknown_allocator_names_the_known_ones():
    with pytest.raises(memory.MemoryConfigError, match="'bfc' is not known.*'naive', 'unified', 'caching'"):
        memory.set_memory_allocator("bfc")
    assert memory.get_memory_allocator() == "unified"
    from pypto_lab.analysis.memory_plan import memory_plan

    g = pypto_lab.capture(torch.nn.Linear(4, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match="allocator 'pool' is not known"):
        memory_plan(g, allocator="pool")
