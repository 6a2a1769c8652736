"""Plot functions return Figures whose artists carry the simulator's numbers."""

from pypto_lab import simulate_matmul
from pypto_lab.views import plot_pipe_busy, plot_swimlane


def test_swimlane_draws_every_instruction_of_the_core():
    r = simulate_matmul(512, 512, 512, chip="Ascend910B1")
    fig = plot_swimlane(r, core=0)
    ax = fig.axes[0]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == int((r.instructions.core == 0).sum())
    assert f"{r.cycles:,.0f} cycles" in ax.get_title()
    assert {t.get_text() for t in ax.get_yticklabels()} >= {"MTE2", "CUBE", "FIXP"}


def test_pipe_busy_bars_are_fractions_of_the_kernel():
    r = simulate_matmul(1024, 1024, 1024, chip="Ascend910B1")
    ax = plot_pipe_busy(r).axes[0]
    widths = {lab.get_text(): p.get_width() for lab, p in zip(ax.get_yticklabels(), ax.patches)}
    assert abs(widths["CUBE"] - r.pipe_busy["CUBE"] / r.cycles) < 1e-9
