"""ipywidgets front ends of `pypto_lab.views`: the tiling explorers and a model dashboard.

Every number shown comes from the simulator: each change of a control re-runs
`simulate_matmul` / `simulate_vector` (a few ms for one layer) and redraws one reused matplotlib
Figure into an `ipywidgets.Image` (PNG), so an update costs well under 100 ms
(`benchmarks/bench_widgets.py`).

Stable handles, for notebooks, tests and the browser test:

* ``w.sliders[name]`` -- an ``IntSlider`` per tile size (``m_l0 m_l1 k_l0 k_l1 n_l0 n_l1`` for a
  Cube kernel, ``rows cols`` for a Vector kernel); its ``description`` is the name and it carries
  the CSS class ``pypto-<name>`` (e.g. ``.pypto-m_l1``);
* ``w.double_buffer`` -- a ``Checkbox`` (CSS class ``pypto-double_buffer``);
* ``w.cycles_label`` -- an ``HTML`` whose value contains ``cycles: <number>`` (plain digits) or
  ``cycles: n/a`` for an illegal tiling (class ``pypto-cycles``);
* ``w.utilization_label`` -- ``HTML`` with ``cube: <pct>%`` and ``vector: <pct>%`` (class ``pypto-utilization``);
* ``w.occupancy_label`` -- ``HTML`` with one bar per buffer and its text ``L0A: 50.0%`` (class
  ``pypto-occupancy``); a buffer over capacity gets a red bar and the class ``pypto-over``;
* ``w.error_label`` -- ``HTML`` with the `TilingError` text, empty when the tiling is legal
  (class ``pypto-error``);
* ``w.image`` -- the rendered figure (occupancy bars and pipe swimlane), ``w.figure`` the Figure;
* ``w.report`` (the last `KernelReport`, None when illegal), ``w.error`` (the last `TilingError`
  or None), ``w.over`` (buffers over capacity), ``w.last_update_ms``;
* ``w.widget`` -- the container (a ``VBox`` with class ``pypto-tiling-explorer``); the explorer
  displays as it in a notebook.
"""

from __future__ import annotations

import html
import io
import textwrap
import time

import ipywidgets as W
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..hw.chip import DTYPE_BYTES, PIPES, get_chip
from ..hw.kernels import VECTOR_OPS, simulate_matmul, simulate_vector
from ..hw.tiling import CubeTile, TilingError, VecTile, ceil_align, cube_tile_bytes, default_vec_tile
from . import views

RED, BLUE = "#c44e52", "#4c72b0"


def figure_png(fig: Figure, dpi: int = 80) -> bytes:
    """PNG bytes of a Figure (Agg), for an ``ipywidgets.Image``."""
    from PIL import Image

    buf = io.BytesIO()
    if dpi != fig.dpi:
        fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).save(
        buf, format="png", compress_level=1)
    return buf.getvalue()


def figure_widget(fig: Figure, dpi: int = 80) -> W.Image:
    """An ``ipywidgets.Image`` showing ``fig``."""
    return W.Image(value=figure_png(fig, dpi), format="png")


class _Explorer:
    """Shared machinery: controls, labels, the reused figure and the update loop."""

    buffers: tuple[str, ...] = ()

    def __init__(self, chip, core: int | None, render: bool, dpi: int):
        self.chip = get_chip(chip)
        self.core = core
        self.render = render
        self.report = None
        self.error: TilingError | None = None
        self.over: list[str] = []
        self.occupancy: dict[str, dict] = {}
        self.last_update_ms = 0.0
        self.updates = 0
        self.buffers = tuple(b for b in self.buffers if b in self.chip.buffers)
        self.double_buffer = W.Checkbox(value=True, description="double_buffer", indent=False)
        self.double_buffer.add_class("pypto-double_buffer")
        self.cycles_label = W.HTML()
        self.cycles_label.add_class("pypto-cycles")
        self.utilization_label = W.HTML()
        self.utilization_label.add_class("pypto-utilization")
        self.occupancy_label = W.HTML()
        self.occupancy_label.add_class("pypto-occupancy")
        self.error_label = W.HTML()
        self.error_label.add_class("pypto-error")
        self.image = W.Image(format="png")
        self.image.add_class("pypto-figure")
        self._dpi = dpi
        self._build_figure()

    # ---- controls -------------------------------------------------------------------------
    def _slider(self, name: str, value: int, lo: int, hi: int, step: int) -> W.IntSlider:
        s = W.IntSlider(value=value, min=lo, max=max(hi, value), step=step, description=name,
                        continuous_update=True, style={"description_width": "initial"})
        s.add_class(f"pypto-{name}")
        return s

    def _wire(self, title: str) -> None:
        for s in self.sliders.values():
            s.observe(self.update, names="value")
        self.double_buffer.observe(self.update, names="value")
        controls = W.VBox([W.HTML(f"<b>{html.escape(title)}</b>"), *self.sliders.values(), self.double_buffer])
        info = W.VBox([self.cycles_label, self.utilization_label, self.occupancy_label, self.error_label])
        self.widget = W.VBox([W.HBox([controls, info]), self.image])
        self.widget.add_class("pypto-tiling-explorer")
        self.update()

    # ---- figure ---------------------------------------------------------------------------
    def _build_figure(self) -> None:
        fig = Figure(figsize=(10, 3.0), dpi=self._dpi)
        gs = fig.add_gridspec(1, 2, width_ratios=(1, 2.8), left=0.07, right=0.98, bottom=0.15, top=0.88,
                              wspace=0.18)
        self.figure = fig
        self._ax_occ = fig.add_subplot(gs[0])
        self._ax_sw = fig.add_subplot(gs[1])
        ax = self._ax_occ
        names = list(self.buffers)
        self._bars = ax.barh(names, [0.0] * len(names), color=BLUE)
        self._bar_text = [ax.text(0.02, i, "", va="center", fontsize=7) for i in range(len(names))]
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlim(0, 1.3)
        ax.set_xticks([0, 0.5, 1.0])
        ax.invert_yaxis()
        ax.set_xlabel("fraction of capacity", fontsize=8)
        ax.tick_params(labelsize=8)
        # fixed title positions: matplotlib's automatic placement measures every tick label
        self._occ_title = ax.set_title(" ", fontsize=9, y=1.0)
        sw = self._ax_sw
        sw.set_yticks(range(len(PIPES)), PIPES, fontsize=7)
        sw.set_ylim(len(PIPES) - 0.5, -0.5)
        sw.set_xlabel("cycles", fontsize=8)
        sw.tick_params(labelsize=7)
        sw.xaxis.set_major_locator(MaxNLocator(5))
        self._sw_title = sw.set_title(" ", fontsize=8, y=1.0)
        self._err_text = sw.text(0.01, 0.97, "", va="top", fontsize=8, color=RED, transform=sw.transAxes)
        FigureCanvasAgg(fig)
        # blitting: what changes is drawn over a cached background of what does not (axes frames,
        # y labels); tick labels and titles are most of matplotlib's drawing time
        self._dynamic = [*self._bars, *self._bar_text, self._occ_title, self._sw_title, self._err_text, sw.xaxis]
        for a in self._dynamic:
            a.set_animated(True)
        self._background = None

    def _draw(self) -> None:
        occ = self.occupancy
        for i, b in enumerate(self.buffers):
            o = occ.get(b, {"fraction": 0.0, "bytes": 0, "capacity": 1, "over": False})
            self._bars[i].set_width(min(o["fraction"], 1.25))
            self._bars[i].set_color(RED if o["over"] else BLUE)
            self._bar_text[i].set_text(f"{o['bytes'] / 1024:.0f}/{o['capacity'] / 1024:.0f} KB")
            self._bar_text[i].set_x(min(o["fraction"], 1.25) + 0.02)
        sw = self._ax_sw
        for c in list(sw.collections):
            c.remove()
        if self.error is not None:
            self._occ_title.set_text("illegal tiling")
            self._occ_title.set_color(RED)
            self._err_text.set_text("TilingError:\n" + "\n".join(textwrap.wrap(str(self.error), 95)))
            self._sw_title.set_text("")
        else:
            r = self.report
            self._occ_title.set_text(f"{r.cycles:,.0f} cycles")
            self._occ_title.set_color("black")
            self._err_text.set_text("")
            core, sel = views._core_sel(r.instructions, self.core)
            views._draw_lanes(sw, r.instructions, sel, 0, 0.0, label=False)
            for c in sw.collections:
                c.set_animated(True)
            sw.set_xlim(0, max(r.cycles, 1.0) * 1.02)
            self._sw_title.set_text(f"{r.name}, core {core}, tile {_tile_str(r.tile)}"
                                    + ("" if r.double_buffer else ", single-buffered"))
        if self.render:
            self.image.value = self._blit_png()

    def _blit_png(self) -> bytes:
        """PNG of the figure: the cached static background plus the artists that change."""
        from PIL import Image

        canvas = self.figure.canvas
        if self._background is None:
            canvas.draw()  # animated artists are skipped: this is the static part
            self._background = canvas.copy_from_bbox(self.figure.bbox)
        canvas.restore_region(self._background)
        renderer = canvas.get_renderer()
        for a in [*self._dynamic, *self._ax_sw.collections]:
            a.draw(renderer)
        buf = io.BytesIO()
        Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).save(
            buf, format="png", compress_level=1)
        return buf.getvalue()

    # ---- update ---------------------------------------------------------------------------
    def _simulate(self):
        raise NotImplementedError

    def _requested(self) -> dict[str, int]:
        raise NotImplementedError

    def update(self, *_) -> None:
        """Re-simulate with the controls' values and refresh every label and the figure."""
        t0 = time.perf_counter()
        try:
            self.report, self.error = self._simulate(), None
            self.occupancy = views.tiling_occupancy(self.report, self.chip, buffers=self.buffers)
        except TilingError as exc:
            self.report, self.error = None, exc
            self.occupancy = views.tiling_occupancy(exc, self.chip, self._requested(), self.buffers)
        self.over = [b for b, o in self.occupancy.items() if o["over"]]
        self._labels()
        self._draw()
        self.updates += 1
        self.last_update_ms = (time.perf_counter() - t0) * 1e3

    def _labels(self) -> None:
        r = self.report
        if r is None:
            self.cycles_label.value = "<b>cycles: n/a</b> (illegal tiling)"
            self.utilization_label.value = "cube: n/a, vector: n/a"
            self.error_label.value = (f"<div class='pypto-tiling-error' style='color:{RED}'>TilingError: "
                                      f"{html.escape(str(self.error))}</div>")
        else:
            self.cycles_label.value = (f"<b>cycles: {r.cycles:.0f}</b> ({r.time_us:,.2f} us, {r.tflops:,.1f} TFLOPS, "
                                       f"{r.bound}-bound by the roofline)")
            self.utilization_label.value = (f"cube: {100 * r.cube_utilization:.1f}%, "
                                            f"vector: {100 * r.vector_utilization:.1f}%")
            self.error_label.value = ""
        rows = []
        for b, o in self.occupancy.items():
            colour = RED if o["over"] else BLUE
            width = min(100.0, 100 * o["fraction"])
            cls = "pypto-bar pypto-over" if o["over"] else "pypto-bar"
            rows.append(
                f"<div class='pypto-buf pypto-buf-{b}' style='display:flex;align-items:center;gap:6px'>"
                f"<span style='width:3em'>{b}</span>"
                f"<span style='display:inline-block;width:160px;height:10px;border:1px solid #888'>"
                f"<span class='{cls}' style='display:block;height:100%;width:{width:.1f}%;background:{colour}'></span>"
                f"</span><span>{b}: {100 * o['fraction']:.1f}% ({o['bytes']} of {o['capacity']} bytes)</span></div>")
        self.occupancy_label.value = "".join(rows)

    @property
    def occupancy_text(self) -> str:
        """The per-buffer percentages, as plain text (``"L1: 75.0%, L0A: 100.0%, ..."``)."""
        return ", ".join(f"{b}: {100 * o['fraction']:.1f}%" for b, o in self.occupancy.items())

    def set(self, **values) -> None:
        """Set several controls at once with one update (``w.set(m_l0=64, m_l1=128)``)."""
        for s in self.sliders.values():
            s.unobserve(self.update, names="value")
        self.double_buffer.unobserve(self.update, names="value")
        try:
            for name, v in values.items():
                if name == "double_buffer":
                    self.double_buffer.value = bool(v)
                else:
                    s = self.sliders[name]
                    s.max = max(s.max, v)
                    s.value = v
        finally:
            for s in self.sliders.values():
                s.observe(self.update, names="value")
            self.double_buffer.observe(self.update, names="value")
        self.update()

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self):  # older IPython
        from IPython.display import display

        display(self.widget)


def _tile_str(tile: dict) -> str:
    if "m_l0" in tile:
        return str(CubeTile(**tile))
    return str(VecTile(**tile))


class TilingExplorer(_Explorer):
    """Tile sizes of one Cube kernel (``C[m, n] = A[m, k] @ B[k, n]``, ``batch`` copies) against
    the chip's buffers; see the module docstring for the handles."""

    buffers = views.TILING_BUFFERS

    def __init__(self, m: int, k: int, n: int, chip="Ascend910B1", dtype: str = "fp16", batch: int = 1,
                 epilogue: str = "none", tile: CubeTile | dict | None = None, double_buffer: bool = True,
                 core: int | None = None, render: bool = True, dpi: int = 72):
        super().__init__(chip, core, render, dpi)
        self.m, self.k, self.n, self.dtype, self.batch, self.epilogue = m, k, n, dtype, batch, epilogue
        if isinstance(tile, dict):
            tile = CubeTile(**tile)
        if tile is None:
            tile = CubeTile(**simulate_matmul(m, k, n, dtype=dtype, chip=self.chip, batch=batch,
                                              epilogue=epilogue).tile)
        self.default_tile = tile
        align = 32 if DTYPE_BYTES[dtype] == 1 else 16
        dims = {"m": m, "k": k, "n": n}
        self.sliders = {}
        for name, value in tile.to_dict().items():
            dim = dims[name[0]]
            hi = max(ceil_align(dim, align), 512 if name[0] != "k" else 1024)
            self.sliders[name] = self._slider(name, value, align, min(hi, 8192), align)
        self.double_buffer.value = double_buffer
        self._wire(f"matmul {m}x{k}x{n} {dtype} on {self.chip.name}" + (f" x{batch}" if batch > 1 else ""))

    @property
    def tile(self) -> CubeTile:
        return CubeTile(**{name: int(s.value) for name, s in self.sliders.items()})

    def _simulate(self):
        return simulate_matmul(self.m, self.k, self.n, dtype=self.dtype, chip=self.chip, tile=self.tile,
                               double_buffer=self.double_buffer.value, batch=self.batch, epilogue=self.epilogue)

    def _requested(self) -> dict[str, int]:
        """Bytes the asked-for tiling needs per buffer (the tiling rules of `plan_cube`), ping-pong
        slots included where two fit."""
        need = cube_tile_bytes(self.tile, self.dtype, self.chip)
        out = {}
        for b, nbytes in need.items():
            cap = self.chip.buffer(b).size_bytes
            out[b] = 2 * nbytes if (self.double_buffer.value and 2 * nbytes <= cap) else nbytes
        return out


class VectorTilingExplorer(_Explorer):
    """Tile (rows x cols elements) of one Vector kernel against UB; see the module docstring."""

    buffers = ("UB",)

    def __init__(self, op: str, numel: int, row_len: int | None = None, chip="Ascend910B1", dtype: str = "fp16",
                 tile: VecTile | dict | None = None, double_buffer: bool = True, core: int | None = None,
                 render: bool = True, dpi: int = 72):
        super().__init__(chip, core, render, dpi)
        if op not in VECTOR_OPS:
            raise ValueError(f"vector op {op!r} is not known; choose one of {', '.join(VECTOR_OPS)}")
        self.op, self.numel, self.dtype = op, numel, dtype
        self.spec = VECTOR_OPS[op]
        self.row_len = (row_len or min(numel, 1024)) if self.spec.row_wise else None
        if isinstance(tile, dict):
            tile = VecTile(**tile)
        if tile is None:
            tile = default_vec_tile(self.chip, numel, dtype, self.spec.live_buffers, self.row_len)
        self.default_tile = tile
        align = max(1, int(32 // DTYPE_BYTES[dtype]))
        rows_max = max(tile.rows * 4, 64, ceil_align(max(1, numel // (self.row_len or numel)), 1) if self.row_len else 64)
        cols_max = max(tile.cols * 4, ceil_align(self.row_len or 1, align))
        self.sliders = {"rows": self._slider("rows", tile.rows, 1, min(rows_max, 4096), 1),
                        "cols": self._slider("cols", tile.cols, align, min(cols_max, 1 << 16), align)}
        self.double_buffer.value = double_buffer
        self._wire(f"{op} over {numel} {dtype}" + (f" (rows of {self.row_len})" if self.row_len else "")
                   + f" on {self.chip.name}")

    @property
    def tile(self) -> VecTile:
        return VecTile(int(self.sliders["rows"].value), int(self.sliders["cols"].value))

    def _simulate(self):
        return simulate_vector(self.op, self.numel, dtype=self.dtype, chip=self.chip, tile=self.tile,
                               double_buffer=self.double_buffer.value, row_len=self.row_len)

    def _requested(self) -> dict[str, int]:
        t = self.tile
        return {"UB": int(t.elems * DTYPE_BYTES[self.dtype] * self.spec.live_buffers)}


def tiling_explorer(m: int, k: int, n: int, chip="Ascend910B1", dtype: str = "fp16", **kwargs) -> TilingExplorer:
    """The tiling explorer of a Cube kernel (see `TilingExplorer`)."""
    return TilingExplorer(m, k, n, chip=chip, dtype=dtype, **kwargs)


def vector_tiling_explorer(op: str, numel: int, row_len: int | None = None, chip="Ascend910B1",
                           **kwargs) -> VectorTilingExplorer:
    """The tiling explorer of a Vector kernel (see `VectorTilingExplorer`)."""
    return VectorTilingExplorer(op, numel, row_len, chip=chip, **kwargs)


def explorer_for_kernel(kernel) -> _Explorer:
    """A tiling explorer for one kernel of a model (a `KernelCost` or `KernelReport`), on its
    shape, dtype and tiling."""
    r = kernel.reports[0] if hasattr(kernel, "reports") else kernel
    s = r.shape
    if r.unit == "cube":
        m, k, n = (s["gemm_m"], s["gemm_k"], s["gemm_n"]) if "gemm_m" in s else (s["m"], s["k"], s["n"])
        return TilingExplorer(m, k, n, chip=r.chip, dtype=r.dtype, batch=s.get("batch", 1), tile=r.tile,
                              double_buffer=r.double_buffer, epilogue=r.epilogue or "none")
    raise ValueError(f"{r.name} is a {r.unit} kernel: use vector_tiling_explorer(op, numel, row_len)")


# ---- dashboard ------------------------------------------------------------------------------

class Dashboard:
    """One model's views in an ``ipywidgets.Tab`` (``d.tab``), each tab rendered when first shown:
    fusion graph (with a block box), speedup waterfall from level 0, memory occupancy, buffer occupancy,
    swimlane (start kernel and count sliders), roofline, and the tiling explorer of a chosen
    Cube kernel. ``d.render(i)`` renders tab ``i`` now."""

    TITLES = ("fusion graph", "waterfall", "GM memory", "on-chip buffers", "swimlane", "roofline", "tiling")

    def __init__(self, optimized, before=None):
        self.optimized = optimized
        self.before = before
        self.report = optimized.report()
        self.pages = [W.VBox() for _ in self.TITLES]
        self.tab = W.Tab(children=self.pages)
        for i, t in enumerate(self.TITLES):
            self.tab.set_title(i, t)
        self.tab.add_class("pypto-dashboard")
        self.rendered: set[int] = set()
        self.explorer: TilingExplorer | None = None
        self.tab.observe(lambda ch: self.render(ch["new"]), names="selected_index")
        self.render(0)

    def _image(self, fig) -> W.Image:
        return figure_widget(fig)

    def render(self, i: int | None) -> None:
        if i is None or i in self.rendered:
            return
        self.rendered.add(i)
        om, rep = self.optimized, self.report
        page = self.pages[i]
        title = self.TITLES[i]
        if title == "fusion graph":
            block = W.Text(value="", description="block", placeholder="e.g. layer1.0 or encoder.layer.0")
            out = W.VBox()

            def draw(*_):
                try:
                    fig = views.plot_fusion_graph(om, before=self.before, block=block.value.strip() or None)
                    out.children = [self._image(fig)]
                except ValueError as exc:
                    out.children = [W.HTML(f"<span style='color:{RED}'>{html.escape(str(exc))}</span>")]

            block.observe(draw, names="value")
            draw()
            page.children = [block, out]
        elif title == "waterfall":
            level0 = self.before if self.before is not None and views._report_of(self.before).level == 0 else None
            page.children = [self._image(views.plot_speedup_waterfall(om, level0=level0))]
        elif title == "GM memory":
            page.children = [self._image(views.plot_memory_occupancy(om))]
        elif title == "on-chip buffers":
            page.children = [self._image(views.plot_buffer_occupancy(rep))]
        elif title == "swimlane":
            start = W.IntSlider(value=0, min=0, max=max(len(rep.kernels) - 1, 0), description="start_kernel")
            count = W.IntSlider(value=5, min=1, max=20, description="count")
            out = W.VBox()

            def draw(*_):
                out.children = [self._image(views.plot_model_swimlane(om, start.value, count.value))]

            start.observe(draw, names="value")
            count.observe(draw, names="value")
            draw()
            page.children = [W.HBox([start, count]), out]
        elif title == "roofline":
            page.children = [self._image(views.plot_roofline(rep))]
        elif title == "tiling":
            cubes = [(k.name, i) for i, k in enumerate(rep.kernels) if k.reports and k.reports[0].unit == "cube"]
            if not cubes:
                page.children = [W.HTML("no Cube kernel in this model")]
                return
            slowest = max(cubes, key=lambda c: rep.kernels[c[1]].time_us)[1]
            pick = W.Dropdown(options=cubes, value=slowest, description="kernel")
            holder = W.VBox()

            def choose(*_):
                self.explorer = explorer_for_kernel(rep.kernels[pick.value])
                holder.children = [self.explorer.widget]

            pick.observe(choose, names="value")
            choose()
            page.children = [pick, holder]

    def _repr_mimebundle_(self, **kwargs):
        return self.tab._repr_mimebundle_(**kwargs)


def dashboard(optimized, before=None) -> Dashboard:
    """The model's views in one ``ipywidgets.Tab`` (see `Dashboard`); ``d.tab`` is the widget."""
    return Dashboard(optimized, before)


__all__ = ["TilingExplorer", "VectorTilingExplorer", "tiling_explorer", "vector_tiling_explorer",
           "explorer_for_kernel", "Dashboard", "dashboard", "figure_png", "figure_widget"]
