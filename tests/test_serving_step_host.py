"""The serving stack's per-step host time (``step_host_us`` of a stack preset, e.g. the graph replay
of vllm-ascend-aclgraph) is charged once per engine step, whatever the step holds: not per request,
not per kernel."""

from __future__ import annotations

import pytest

from pypto_lab.llm import serve, step_model
from pypto_lab.stack import get_stack

SMALL = dict(model="qwen2-0.5b", chip="Ascend910B1")
HOST_US = 750.0


def _models():
    stack = get_stack("vllm-ascend-aclgraph")
    without = step_model(SMALL["model"], SMALL["chip"], stack=stack.with_values(step_host_us=0.0))
    with_host = step_model(SMALL["model"], SMALL["chip"], stack=stack.with_values(step_host_us=HOST_US))
    return without, with_host


@pytest.mark.parametrize("prefill, decode", [([], [300]), ([], [300] * 32), ([(512, 0)], []), ([(128, 0)], [200] * 16)],
                         ids=["one decode", "32 decodes", "a prefill", "prefill and 16 decodes"])
def test_one_step_pays_the_host_time_once(prefill, decode):
    without, with_host = _models()
    assert with_host.step_ms(prefill, decode) - without.step_ms(prefill, decode) == pytest.approx(HOST_US / 1000)


def test_a_serving_run_pays_it_once_per_step():
    stack = get_stack("vllm-ascend-aclgraph")
    rows = [(64, 16)] * 8   # all at t=0: the same steps whatever they cost
    runs = [serve(SMALL["model"], SMALL["chip"], requests=8, rate=float("inf"), lengths=rows, progress=False,
                  stack=stack.with_values(step_host_us=h)) for h in (0.0, HOST_US)]
    assert runs[0].steps == runs[1].steps
    assert runs[1].duration_s - runs[0].duration_s == pytest.approx(runs[0].steps * HOST_US * 1e-6, rel=1e-6)
