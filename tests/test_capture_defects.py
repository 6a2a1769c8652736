"""Capture and its cache, as users found them broken: a model edited in place must not be served a
stale graph."""

import pytest
import torch
from torch import nn

import pypto_lab
from pypto_lab.capture import capture
from pypto_lab.capture.export import model_fingerprint


class Block(nn.Module):
    """A small model with the kinds of state a user edits in place: activations, flags, weights."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.clip = nn.Hardtanh(-1.0, 1.0)
        self.leaky = nn.LeakyReLU(0.01)
        self.fc = nn.Linear(8 * 6 * 6, 10)
        self.residual = True  # a plain bool that forward reads

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        if self.residual:
            y = y + x.mean(1, keepdim=True)
        return self.fc(self.leaky(self.clip(y) - 0.5).flatten(1))


def _block():
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():  # running statistics that are not the identity, so eps and edits matter
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.05, 0.2)
    return model, torch.randn(2, 3, 6, 6)


def _matches_model(model, x):
    om = pypto_lab.optimize(model, x, chip="Ascend910B1", precision="fp32")
    with torch.no_grad():
        expected = model(x)
    return pypto_lab.compare_tensors(om(x), expected, verbose=False).passed


def _set_gelu(m):
    m.act = nn.GELU()


def _set_max_val(m):
    m.clip.max_val = 0.25


def _set_slope(m):
    m.leaky.negative_slope = 0.5


def _set_residual(m):
    m.residual = False


def _set_eps(m):
    m.bn.eps = 0.5


@pytest.mark.parametrize("edit", [_set_gelu, _set_max_val, _set_slope, _set_residual, _set_eps],
                         ids=["activation swap", "Hardtanh.max_val", "LeakyReLU.negative_slope",
                              "custom bool flag", "BatchNorm.eps"])
def test_optimize_follows_a_model_edited_in_place(edit):
    model, x = _block()
    assert _matches_model(model, x)
    with torch.no_grad():
        before = model(x)
    edit(model)
    with torch.no_grad():
        assert not torch.allclose(model(x), before, atol=1e-3)  # the edit changes what the model computes
    assert _matches_model(model, x)


def test_new_weight_values_are_honoured():
    model, x = _block()
    assert _matches_model(model, x)
    with torch.no_grad():
        model.fc.weight.mul_(3.0)
        model.conv.bias.add_(0.5)
        model.bn.running_var.mul_(4.0)
    assert _matches_model(model, x)
    model.fc.bias = nn.Parameter(torch.randn(10))  # a new Parameter object of the same shape
    assert _matches_model(model, x)


def test_a_tensor_constant_replaced_is_recaptured():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.scale = torch.tensor([2.0])  # neither parameter nor buffer: a constant of the program

        def forward(self, x):
            return self.lin(x) * self.scale

    torch.manual_seed(0)
    model, x = Scaled().eval(), torch.randn(4, 8)
    assert _matches_model(model, x)
    model.scale = torch.tensor([-3.0])
    assert _matches_model(model, x)


def test_an_unchanged_model_is_captured_once():
    model, x = _block()
    first = capture(model, x)
    fingerprint = model_fingerprint(model)
    with torch.no_grad():
        model(x)  # running the model, or editing weight values, changes nothing the graph depends on
        model.fc.weight.add_(1.0)
    assert model_fingerprint(model) == fingerprint
    assert capture(model, x).exported_program is first.exported_program
    model.leaky.negative_slope = 0.2
    assert model_fingerprint(model) != fingerprint
    assert capture(model, x).exported_program is not first.exported_program


# ---- training flags: each module keeps its own ----------------------------------------------------

def _training_model_with_frozen_parts():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.5),
                          nn.Flatten(), nn.Linear(8 * 4 * 4, 4)).train()
    model[1].eval()  # a frozen BatchNorm and a Dropout switched off inside a model that trains
    model[3].eval()
    return model


def _flags(model):
    return {name: m.training for name, m in model.named_modules()}


def test_capture_gives_every_module_its_own_training_flag_back():
    model = _training_model_with_frozen_parts()
    before = _flags(model)
    assert before[""] and not before["1"] and not before["3"]
    capture(model, torch.randn(2, 3, 6, 6))
    assert _flags(model) == before


def test_calibrate_gives_every_module_its_own_training_flag_back():
    from pypto_lab.precision import quantization as Q

    prepared = Q.prepare(_training_model_with_frozen_parts())
    before = _flags(prepared)
    assert before[""] and not before["1"] and not before["3"]
    Q.calibrate(prepared, [torch.randn(2, 3, 6, 6)])
    assert _flags(prepared) == before


# ---- threads: torch.export is not thread-safe, capture serialises it ------------------------------

def _small_models():
    torch.manual_seed(0)
    return [(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval(), torch.randn(2, 8)),
            (nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), torch.randn(1, 3, 8, 8)),
            (nn.Sequential(nn.LayerNorm(32), nn.GELU()).eval(), torch.randn(4, 32)),
            (nn.Sequential(nn.Linear(8, 8), nn.Sigmoid()).eval(), torch.randn(3, 8))]


def _all_at_once(work, items):
    """Run ``work(*item)`` for every item in its own thread, all released together; the results and
    the exceptions raised."""
    import threading

    barrier = threading.Barrier(len(items))
    results, errors = [None] * len(items), []

    def run(i, item):
        barrier.wait()
        try:
            results[i] = work(*item)
        except Exception as exc:  # collected: the test shows them
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, item)) for i, item in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


def test_threads_capture_different_models_at_once():
    for _ in range(3):  # unserialised, every round failed inside torch.export
        models = _small_models()
        graphs, errors = _all_at_once(capture, models)
        assert errors == []
        for graph, (model, x) in zip(graphs, models):  # each thread got its own model's graph
            with torch.no_grad():
                assert graph.node(graph.outputs[0]).outputs[0].shape == tuple(model(x).shape)
            assert {n.module_type.rsplit(".", 1)[-1] for n in graph.nodes} == {type(m).__name__ for m in model}


def test_threads_optimize_at_once_and_compute_their_own_model():
    models = _small_models()[:2]
    optimized, errors = _all_at_once(
        lambda model, x: pypto_lab.optimize(model, x, chip="Ascend910B1", precision="fp32"), models)
    assert errors == []
    for om, (model, x) in zip(optimized, models):
        with torch.no_grad():
            assert pypto_lab.compare_tensors(om(x), model(x), verbose=False).passed


def test_a_capture_error_gives_the_data_dependent_hint_only_where_it_applies():
    from pypto_lab.capture import CaptureError

    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x

    class ThroughNumpy(nn.Module):
        def forward(self, x):
            return torch.from_numpy(x.detach().numpy() * 2)

    with pytest.raises(CaptureError, match="data-dependent Python control flow: replace such branches"):
        capture(Branchy(), torch.randn(4, 4))
    with pytest.raises(CaptureError) as err:
        capture(ThroughNumpy(), torch.randn(4, 4))
    assert "data-dependent" not in str(err.value) and "capture a sub-module that exports" in str(err.value)
