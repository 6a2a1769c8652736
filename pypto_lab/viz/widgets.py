"""ipywidgets front ends of `pypto_lab.views`: the tiling explorers and a model dashboard.

A tiling explorer cannot be broken by accident. Each slider offers only values that keep the
tiling well-formed: tile sizes are multiples of the dtype's alignment and each ``*_l1`` is a
multiple of its ``*_l0`` (PyPTO's rules, `pypto_lab.hw.tiling.plan_cube`), so every step of a
slider is the next well-formed tiling; when ``m_l0`` moves, ``m_l1`` moves to the nearest multiple
of it and its slider steps by the new ``m_l0``. A well-formed tiling can still overflow a buffer:
then every overflowing buffer is listed at once with a fix (``L0A 800 % (512 of 64 KB): try
m_l0 = 32 or k_l0 = 16``) and the swimlane area shows what to change instead of a swimlane. The
figure keeps its size and the labels their place, so nothing jumps as the sliders move.

Every number shown comes from the simulator: each change of a control re-runs `simulate_matmul` /
`simulate_vector` (a few ms for one layer) and redraws one reused matplotlib Figure into an
``ipywidgets.Image`` (PNG at 200 dpi, shown 960 CSS pixels wide: two device pixels per CSS pixel, sharp on a
retina screen). An update is kept under 16 ms (`benchmarks/bench_widgets.py` measures it): what
changes is blitted over a cached background (the swimlane's x axis is the share of the kernel's
cycles, so its ticks never change), each pipe's instructions are one compound path, the PNG is
encoded from the explorer's fixed palette, and what the labels above already say (cycles, bytes
per buffer, every overflow's fix) is drawn only into the picture a saved notebook keeps (`png`).

Stable handles, for notebooks, tests and the browser test:

* ``w.sliders[name]`` -- an ``IntSlider`` per tile size (``m_l0 m_l1 k_l0 k_l1 n_l0 n_l1`` for a
  Cube kernel, ``rows cols`` for a Vector kernel); its ``description`` is the name and it carries
  the CSS class ``pypto-<name>`` (e.g. ``.pypto-m_l1``). Its ``min``, ``step`` and ``max`` follow
  the rules: the values it offers are ``min + i * step``. When they change (an ``*_l1`` when its
  ``*_l0`` moves) the slider is a new widget in the same place, so look it up in ``w.sliders``
  each time. A value set on a slider from code that the rules do not allow moves to the nearest
  allowed one; ``w.set(...)`` raises instead;
* ``w.double_buffer`` -- a ``Checkbox`` (CSS class ``pypto-double_buffer``);
* ``w.cycles_label`` -- a ``Label`` (plain text, bold; class ``pypto-cycles``) reading
  ``cycles: <digits> (...)``, or ``cycles: n/a (...)`` when the tiling does not fit;
* ``w.utilization_label`` -- a ``Label`` with ``cube: <pct>%, vector: <pct>%`` (class ``pypto-utilization``);
* ``w.occupancy_label`` -- ``HTML`` with one bar per buffer and its text ``L0A: 50.0%`` (class
  ``pypto-occupancy``); a buffer over capacity gets a red bar and the class ``pypto-over``;
* ``w.error_label`` -- ``HTML`` with one line per overflowing buffer and its fix (class
  ``pypto-error``; each line has the class ``pypto-overflow``), empty when every buffer fits;
* plain text of the labels: ``w.cycles_text``, ``w.utilization_text``, ``w.occupancy_text``,
  ``w.error_text`` (the overflow lines), and ``w.text`` (all of them);
* ``w.image`` -- the rendered figure (class ``pypto-figure``: occupancy bars and pipe swimlane,
  or the overflow placeholder), ``w.figure`` the Figure, ``w.png()`` its PNG bytes (100 dpi);
* ``w.report`` (the last `KernelReport`, None when the tiling does not fit), ``w.error`` (the
  simulator's `TilingError` or None), ``w.overflows`` (an `Overflow` per buffer over capacity),
  ``w.over`` (their buffer names), ``w.tile``, ``w.last_update_ms``;
* ``w.widget`` -- the container (a ``VBox`` with class ``pypto-tiling-explorer``). The explorer
  displays as it in a notebook, with a PNG of its figure and its text beside it, so a saved
  notebook shows the figure where no widget can run (GitHub, nbviewer, before running).
"""

from __future__ import annotations

import base64
import html
import io
import numbers
import textwrap
import time
from dataclasses import dataclass

import ipywidgets as W
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import PathPatch, Rectangle
from matplotlib.path import Path

from ..hw.capabilities import as_epilogue
from ..hw.chip import DEFAULT_CHIP, DTYPE_BYTES, PIPES, get_chip
from ..hw.kernels import VECTOR_OPS, simulate_matmul, simulate_vector
from ..hw.tiling import CubeTile, TilingError, VecTile, ceil_align, cube_tile_bytes, default_vec_tile
from . import views

RED, BLUE, ORANGE, GREY = "#c44e52", "#4c72b0", "#dd8452", "#f2f2f2"
FIG_SIZE = (9.6, 3.0)      # inches: the explorer's figure never changes size
DISPLAY_WIDTH_PX = 960     # CSS pixels it is shown at (100 per inch)
EXPLORER_DPI = 200         # PNG pixels per inch: 2 device pixels per CSS pixel (retina)
STATIC_DPI = 100           # the picture a saved notebook keeps beside the widget: 1 pixel per CSS pixel


def _png_bytes(canvas: FigureCanvasAgg, compress_level: int, palette=None, description: str | None = None) -> bytes:
    """PNG of the canvas: RGB, or with ``palette`` (a PIL "P" image, `_explorer_palette`) each
    pixel mapped to its nearest palette colour, a third of the bytes to compress (a fifth of the
    time of RGB at 1920 x 600 px: the explorer's colours are few). ``description`` is stored in the
    file (an iTXt chunk): what the picture shows, so two states that draw alike (the swimlane's
    axis is relative) are still two images, and the browser shows each new one."""
    from PIL import Image, PngImagePlugin

    buf = io.BytesIO()
    # RGB: the figure is opaque, and a quarter less to encode and send
    rgb = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1).convert("RGB")
    if palette is not None:
        rgb = rgb.quantize(palette=palette, dither=Image.Dither.NONE)
    info = None
    if description:
        info = PngImagePlugin.PngInfo()
        info.add_itxt("Description", description)
    rgb.save(buf, format="png", compress_level=compress_level, pnginfo=info)
    return buf.getvalue()


_PALETTE = None


def _explorer_palette():
    """A fixed palette of every colour the explorer draws — the pipes', the bars', the text's —
    over white and over the placeholder's grey at four coverages (anti-aliased edges), and 32
    greys for anti-aliased black text: at most 256 entries, built once."""
    global _PALETTE
    if _PALETTE is None:
        from matplotlib.colors import to_rgb
        from PIL import Image

        bases = [*views.PIPE_COLOURS.values(), RED, BLUE, ORANGE, "black"]
        cols: list[tuple[int, int, int]] = [(g, g, g) for g in range(0, 256, 8)] + [(255, 255, 255)]
        for back in ("white", GREY):
            bk = to_rgb(back)
            cols.append(tuple(round(255 * c) for c in bk))
            for base in bases:
                fg = to_rgb(base)
                for a in (0.25, 0.5, 0.75, 1.0):
                    cols.append(tuple(round(255 * (a * f + (1 - a) * b)) for f, b in zip(fg, bk)))
        cols = list(dict.fromkeys(cols))[:256]
        flat = [v for c in cols for v in c] + [0, 0, 0] * (256 - len(cols))
        _PALETTE = Image.new("P", (1, 1))
        _PALETTE.putpalette(flat)
    return _PALETTE


def figure_png(fig: Figure, dpi: int = 120) -> bytes:
    """PNG bytes of a Figure (Agg), for an ``ipywidgets.Image``."""
    buf = io.BytesIO()
    if dpi != fig.dpi:
        fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return _png_bytes(canvas, 1)


def figure_widget(fig: Figure, dpi: int = 120) -> W.Image:
    """An ``ipywidgets.Image`` showing ``fig`` at 100 CSS pixels per inch (``dpi`` PNG pixels per
    inch, so sharper than the page), shrunk to the page's width when wider."""
    width = f"{round(fig.get_figwidth() * 100)}px"
    return W.Image(value=figure_png(fig, dpi), format="png", layout=W.Layout(width=width, max_width="100%",
                                                                             height="auto"))


def _static_bundle(widget, png: bytes, text: str, width_px: int | None = None, **kwargs):
    """A widget's mime bundle plus a PNG and plain text: what a saved notebook shows where the
    widget cannot run."""
    data = dict(widget._repr_mimebundle_(**kwargs) or {})
    data["image/png"] = base64.b64encode(png).decode("ascii")
    data["text/plain"] = text
    meta = {"image/png": {"width": width_px}} if width_px else {}
    return data, meta


class FigureInteract:
    """Controls (ipywidgets) and the figure ``draw(**values)`` returns for their values: every change
    redraws it into an ``ipywidgets.Image``. Displayed, it keeps a PNG of the figure as it stands
    and a line of text beside the widget, so a saved notebook shows the picture, not
    ``<function draw>`` (which ``ipywidgets.interact`` leaves). ``w.figure``, ``w.image``,
    ``w.controls``, ``w.widget``, ``w.text``; ``w.png()`` the picture a saved notebook keeps."""

    def __init__(self, draw, title: str = "", dpi: int = 120, **controls: W.ValueWidget):
        self.draw, self.title, self.dpi, self.controls = draw, title, dpi, controls
        self.image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto"))
        self.image.add_class("pypto-figure")
        for c in controls.values():
            c.observe(self.update, names="value")
        self.widget = W.VBox([W.HBox(list(controls.values())), self.image])
        self.figure: Figure | None = None
        self.update()

    @property
    def values(self) -> dict:
        return {k: c.value for k, c in self.controls.items()}

    def update(self, *_) -> None:
        fig = self.draw(**self.values)
        if getattr(fig.canvas, "manager", None) is not None:   # made with pyplot: not shown twice inline
            import matplotlib.pyplot as plt

            plt.close(fig)
        self.figure = fig
        self.image.value = figure_png(fig, self.dpi)
        self.image.layout.width = f"{round(fig.get_figwidth() * 100)}px"

    def png(self, dpi: int = STATIC_DPI) -> bytes:
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()

    @property
    def text(self) -> str:
        labels = {k: getattr(c, "label", None) or c.value for k, c in self.controls.items()}
        return (f"{self.title}: " if self.title else "") + ", ".join(f"{k} = {v}" for k, v in labels.items())

    def _repr_mimebundle_(self, **kwargs):
        return _static_bundle(self.widget, self.png(), self.text, round(self.figure.get_figwidth() * 100), **kwargs)


def figure_interact(draw, title: str = "", **controls) -> FigureInteract:
    """``draw(**values) -> Figure`` behind ``controls`` (see `FigureInteract`)."""
    return FigureInteract(draw, title, **controls)


# ---- what overflows, and how to fix it ----------------------------------------------------------

@dataclass(frozen=True)
class Overflow:
    """One buffer over its capacity: the bytes the tiling needs there (one slot; a simulated
    kernel's peak where the simulator ran it), the capacity, a fix, and whether the tiling rules
    refuse the tiling (False: the simulator ran it and reports the peak over capacity)."""

    buffer: str
    nbytes: int
    capacity: int
    fix: str
    refused: bool = True

    @property
    def fraction(self) -> float:
        return self.nbytes / self.capacity

    def __str__(self) -> str:
        return (f"{self.buffer} {100 * self.fraction:.0f} % ({self.nbytes / 1024:,.0f} of "
                f"{self.capacity / 1024:,.0f} KB): {self.fix}")


def _nearest_multiple(value: int, base: int, lo: int, hi: int) -> int:
    """The multiple of ``base`` nearest ``value`` (halves round up), within ``lo..hi`` (multiples of base)."""
    return min(max(base * int(value / base + 0.5), lo), hi)


# ---- the explorers ------------------------------------------------------------------------------

class _Explorer:
    """Shared machinery: controls and their rules, labels, the reused figure and the update loop.

    A subclass gives the sliders' ranges (`_ranges`), the bytes per buffer of a tiling
    (`_requested`), the overflows and their fixes (`_overflows`) and the simulation (`_simulate`)."""

    buffers: tuple[str, ...] = ()

    def __init__(self, chip, core: int | None, render: bool, dpi: int):
        self.chip = get_chip(chip)
        self.core = core
        self.render = render
        self.report = None
        self.error: TilingError | None = None
        self.overflows: list[Overflow] = []
        self.occupancy: dict[str, dict] = {}
        self.last_update_ms = 0.0
        self.updates = 0
        self._quiet = False  # True while the explorer moves its own sliders
        self.buffers = tuple(b for b in self.buffers if b in self.chip.buffers)
        self.double_buffer = W.Checkbox(value=True, description="double_buffer", indent=False)
        self.double_buffer.add_class("pypto-double_buffer")
        self.cycles_label = W.Label(style={"font_weight": "bold"})
        self.cycles_label.add_class("pypto-cycles")
        self.utilization_label = W.Label()
        self.utilization_label.add_class("pypto-utilization")
        self.occupancy_label = W.HTML()
        self.occupancy_label.add_class("pypto-occupancy")
        # a fixed height (four lines, then a scroll bar): the figure below never moves
        self.error_label = W.HTML(layout=W.Layout(height="88px", overflow="auto"))
        self.error_label.add_class("pypto-error")
        self.image = W.Image(format="png", layout=W.Layout(width=f"{DISPLAY_WIDTH_PX}px", max_width="100%",
                                                           height="auto"))
        self.image.add_class("pypto-figure")
        self._dpi = dpi
        self._build_figure()

    # ---- controls -------------------------------------------------------------------------
    def _ranges(self, values: dict[str, int]) -> dict[str, tuple[int, int, int, str]]:
        """Per slider ``(min, max, step, rule)`` for well-formed ``values``: the values offered
        are ``min + i * step``; ``rule`` says why, in words."""
        raise NotImplementedError

    def _legal(self, values: dict[str, int]) -> dict[str, int]:
        """``values`` moved to the nearest values the sliders offer, in slider order (a ``*_l1``
        follows its ``*_l0``)."""
        raise NotImplementedError

    @property
    def values(self) -> dict[str, int]:
        return {name: int(s.value) for name, s in self.sliders.items()}

    def _slider(self, name: str, value: int, lo: int, hi: int, step: int) -> W.IntSlider:
        s = W.IntSlider(value=value, min=lo, max=hi, step=step, description=name, continuous_update=True,
                        style={"description_width": "4em"}, layout=W.Layout(width="320px"))
        s.add_class(f"pypto-{name}")
        s.observe(self._on_control, names="value")
        return s

    def _make_sliders(self, values: dict[str, int]) -> None:
        self.sliders = {name: self._slider(name, values[name], lo, hi, step)
                        for name, (lo, hi, step, _) in self._ranges(values).items()}

    def _apply(self, values: dict[str, int]) -> None:
        """Set every slider's value, and give a slider whose range changes (an ``*_l1`` when its
        ``*_l0`` moves) a fresh widget: the browser's slider keeps the range it was created with
        for its Home and End keys (noUiSlider), so a slider whose range only changed would jump
        there. No update runs meanwhile."""
        self._quiet = True
        replaced = []
        try:
            for name, (lo, hi, step, _) in self._ranges(values).items():
                old = self.sliders[name]
                if (old.min, old.max, old.step) == (lo, hi, step):
                    old.value = values[name]
                else:
                    self.sliders[name] = self._slider(name, values[name], lo, hi, step)
                    replaced.append(old)
        finally:
            self._quiet = False
        if replaced:
            self._controls.children = [self._controls.children[0], *self.sliders.values(), self.double_buffer]
            for old in replaced:
                old.unobserve(self._on_control, names="value")
                old.close()

    def _on_control(self, change) -> None:
        if self._quiet:
            return
        if change["owner"] is not self.double_buffer:
            self._apply(self._legal(self.values))
        self.update()

    def _wire(self, title: str) -> None:
        self.double_buffer.observe(self._on_control, names="value")
        self._controls = W.VBox([W.HTML(f"<b>{html.escape(title)}</b>"), *self.sliders.values(), self.double_buffer],
                                layout=W.Layout(width="340px"))
        info = W.VBox([self.cycles_label, self.utilization_label, self.occupancy_label, self.error_label],
                      layout=W.Layout(width="600px"))
        self.widget = W.VBox([W.HBox([self._controls, info]), self.image])
        self.widget.add_class("pypto-tiling-explorer")
        self.update()

    def set(self, **values) -> None:
        """Set several controls at once with one update (``w.set(m_l0=64, m_l1=128)``). A
        ``*_l0`` given without its ``*_l1`` moves the ``*_l1`` to its nearest multiple, as the
        slider does; a value no slider offers raises `TilingError` naming the rule and the
        nearest values that are offered."""
        unknown = sorted(set(values) - set(self.sliders) - {"double_buffer"})
        if unknown:
            raise ValueError(f"no control named {', '.join(unknown)}; the controls are "
                             f"{', '.join([*self.sliders, 'double_buffer'])}")
        asked = {k: v for k, v in values.items() if k != "double_buffer"}
        for name, v in asked.items():
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TilingError(f"{name} = {v!r}: tile sizes are whole numbers")
            asked[name] = int(v)
        merged = {**self.values, **asked}
        legal = self._legal(merged)
        for name in self.sliders:  # in slider order: an l1 is judged against the new l0
            if name in asked and legal[name] != asked[name]:
                lo, hi, step, rule = self._ranges(legal)[name]
                v = asked[name]
                below = max(lo, min(hi, lo + step * ((v - lo) // step)))
                above = min(hi, below + step) if v > below else below
                near = f"{below} or {above}" if above != below else f"{below}"
                raise TilingError(f"{name} = {v} is not a value the {name} slider offers ({rule}); try {near}")
        self._apply(legal)
        if "double_buffer" in values:
            self._quiet = True
            try:
                self.double_buffer.value = bool(values["double_buffer"])
            finally:
                self._quiet = False
        self.update()

    # ---- figure ---------------------------------------------------------------------------
    def _build_figure(self) -> None:
        fig = Figure(figsize=FIG_SIZE, dpi=self._dpi)
        FigureCanvasAgg(fig)
        gs = fig.add_gridspec(1, 2, width_ratios=(1, 2.7), left=0.07, right=0.985, bottom=0.16, top=0.88,
                              wspace=0.2)
        self.figure = fig
        self._ax_occ = fig.add_subplot(gs[0])
        self._ax_sw = fig.add_subplot(gs[1])
        ax = self._ax_occ
        names = list(self.buffers)
        self._bars = ax.barh(names, [0.0] * len(names), color=BLUE)
        self._bar_text = [ax.text(0.02, i, "", va="center", fontsize=7) for i in range(len(names))]
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlim(0, 1.45)
        ax.set_xticks([0, 0.5, 1.0])
        ax.invert_yaxis()
        ax.set_xlabel("fraction of capacity", fontsize=8)
        ax.tick_params(labelsize=8)
        # fixed title positions: matplotlib's automatic placement measures every tick label
        self._occ_title = ax.set_title(" ", fontsize=9, y=1.0)
        sw = self._ax_sw
        sw.set_yticks(range(len(PIPES)), PIPES, fontsize=7)
        sw.set_ylim(len(PIPES) - 0.5, -0.5)
        # x as a share of the kernel's cycles (the cycles are in the label above and the saved
        # picture's title): fixed ticks, drawn once with the background, not at every update
        sw.set_xlim(0, 1.02)
        sw.set_xticks([0, 0.25, 0.5, 0.75, 1.0], ["0", "25%", "50%", "75%", "100%"])
        sw.set_xlabel("share of the kernel's cycles", fontsize=8)
        sw.tick_params(labelsize=7)
        self._sw_title = sw.set_title(" ", fontsize=8, y=1.0)
        self._sw_live_title = sw.text(0.5, 1.0 + 6 / 72 / (FIG_SIZE[1] * 0.72), " ", ha="center", va="baseline",
                                      fontsize=8, transform=sw.transAxes)
        # one compound path per pipe, its rectangles replaced at each update (a PolyCollection of
        # Path objects per instruction costs ten times as much to build and draw)
        self._lanes = [PathPatch(Path(np.zeros((1, 2))), facecolor=views.PIPE_COLOURS[name], edgecolor="none",
                                 visible=False) for name in PIPES]
        for patch in self._lanes:
            sw.add_patch(patch)
        # the placeholder the swimlane area shows when the tiling does not fit
        self._placeholder = Rectangle((0, 0), 1, 1, transform=sw.transAxes, facecolor=GREY, edgecolor="none",
                                      zorder=5, visible=False)
        sw.add_patch(self._placeholder)
        self._placeholder_text = sw.text(0.5, 0.5, "", ha="center", va="center", fontsize=8, color=RED,
                                         transform=sw.transAxes, zorder=6, linespacing=1.5)
        # the live widget lists every overflow with its fix in its label: one fixed line here
        self._placeholder_live = sw.text(0.5, 0.5, "no swimlane: the simulator refuses this tiling (see above)",
                                         ha="center", va="center", fontsize=8, color=RED, transform=sw.transAxes,
                                         zorder=6, visible=False)
        bbox = sw.get_position()
        self._half_px = 0.5 * 1.02 / (bbox.width * FIG_SIZE[0] * self._dpi)   # half a pixel, in x's units
        # blitting: what changes is drawn over a cached background of what does not (axes frames,
        # y labels); tick labels and titles are most of matplotlib's drawing time
        self._dynamic = [*self._bars, *self._bar_text, self._occ_title, self._sw_title, *self._lanes,
                         self._placeholder, self._placeholder_text, self._placeholder_live]
        for a in self._dynamic:
            a.set_animated(True)
        # what the live widget's labels already say (cycles; bytes per buffer) is drawn only in the
        # saved picture (`png`), where no label runs beside it: text is most of an update's drawing
        self._saved_only = {id(a) for a in (*self._bar_text, self._occ_title, self._sw_title, self._placeholder_text)}
        self._background = None

    def _draw(self) -> None:
        occ = self.occupancy
        for i, b in enumerate(self.buffers):
            o = occ.get(b, {"fraction": 0.0, "bytes": 0, "capacity": 1, "over": False})
            width = min(o["fraction"], 1.2)
            self._bars[i].set_width(width)
            self._bars[i].set_color(RED if o["over"] else BLUE)
            self._bar_text[i].set_text(f"{100 * o['fraction']:,.0f} %" if o["over"]
                                       else f"{o['bytes'] / 1024:,.0f}/{o['capacity'] / 1024:,.0f} KB")
            self._bar_text[i].set_x(width + 0.02)
        refused = self.report is None
        for patch in self._lanes:
            patch.set_visible(False)
        self._placeholder.set_visible(refused)
        self._placeholder_text.set_visible(refused)
        self._placeholder_live.set_visible(refused)
        if refused:
            over = [o.buffer for o in self.overflows if o.refused]
            self._occ_title.set_text("does not fit: " + ", ".join(over) if over else "refused")
            self._occ_title.set_color(RED)
            lines = [str(o) for o in self.overflows if o.refused] or textwrap.wrap(str(self.error), 90)
            self._placeholder_text.set_text("no swimlane: the simulator refuses this tiling\n" + "\n".join(lines))
            self._sw_title.set_text(f"tile {self.tile}")
        else:
            r = self.report
            self._occ_title.set_text(f"{r.cycles:,.0f} cycles")
            self._occ_title.set_color(RED if self.overflows else "black")
            core, sel = views._core_sel(r.instructions, self.core)
            self._set_lanes(r.instructions, sel, 1.0 / max(r.cycles, 1.0))
            self._sw_title.set_text(f"{r.name}, core {core}, tile {_tile_str(r.tile)}, {r.cycles:,.0f} cycles"
                                    + ("" if r.double_buffer else ", single-buffered"))
        if self.render:
            self.image.value = self._blit_png()

    def _set_lanes(self, tl, sel, scale: float) -> None:
        """Each pipe's instructions ``sel`` of the timeline as the rectangles of its lane's path
        (x: cycles times ``scale``)."""
        codes_one = np.array([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY], np.uint8)
        for lane, patch in enumerate(self._lanes):
            idx = sel[tl.pipe[sel] == lane]
            if not idx.size:
                continue
            x0, x1 = tl.start[idx] * scale, tl.end[idx] * scale
            # a gap of half a pixel before the next instruction (where the bar is wider than that),
            # as views' white edges draw it, without stroking every rectangle
            x1 = np.maximum(x1 - self._half_px, np.minimum(x1, x0 + self._half_px))
            y0, y1 = lane - 0.4, lane + 0.4
            verts = np.empty((idx.size, 5, 2))
            verts[:, :, 0] = np.column_stack((x0, x0, x1, x1, x0))
            verts[:, :, 1] = (y0, y1, y1, y0, y0)
            patch.set_path(Path(verts.reshape(-1, 2), np.tile(codes_one, idx.size)))
            patch.set_visible(True)

    def _blit_png(self, compress_level: int = 1) -> bytes:
        """PNG of the figure: the cached static background plus the artists that change."""
        canvas = self.figure.canvas
        if self._background is None:
            self._sw_live_title.set_text(f"{getattr(self, 'title', '')}: the pipes of "
                                         + ("one core" if self.core is None else f"core {self.core}"))
            canvas.draw()  # animated artists are skipped: this is the static part
            self._background = canvas.copy_from_bbox(self.figure.bbox)
        canvas.restore_region(self._background)
        renderer = canvas.get_renderer()
        for a in self._dynamic:
            if a.get_visible() and id(a) not in self._saved_only:
                a.draw(renderer)
        state = f"{self.text}\ndouble_buffer {self.double_buffer.value}"
        return _png_bytes(canvas, compress_level, _explorer_palette(), state)

    def png(self, dpi: int = STATIC_DPI) -> bytes:
        """The figure as it stands, as PNG bytes at ``dpi`` (what a saved notebook keeps)."""
        changing = list(self._dynamic)
        for a in changing:  # savefig skips animated artists
            a.set_animated(False)
        self._sw_live_title.set_visible(False)   # the full title (tile, cycles) takes its place
        live_placeholder = self._placeholder_live.get_visible()
        self._placeholder_live.set_visible(False)   # the full overflow lines take its place
        try:
            buf = io.BytesIO()
            self.figure.savefig(buf, format="png", dpi=dpi)
        finally:
            for a in changing:
                a.set_animated(True)
            self._sw_live_title.set_visible(True)
            self._placeholder_live.set_visible(live_placeholder)
            self._background = None  # the canvas was redrawn at another size
        return buf.getvalue()

    # ---- update ---------------------------------------------------------------------------
    def _simulate(self):
        raise NotImplementedError

    def _requested(self) -> dict[str, int]:
        raise NotImplementedError

    def _overflows(self) -> list[Overflow]:
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
        self.overflows = self._overflows()
        self._labels()
        self._draw()
        self.updates += 1
        self.last_update_ms = (time.perf_counter() - t0) * 1e3

    @property
    def over(self) -> list[str]:
        """Buffers over capacity, in the order of `overflows`."""
        return [o.buffer for o in self.overflows]

    def _labels(self) -> None:
        r = self.report
        if r is None:
            what = ", ".join(o.buffer for o in self.overflows if o.refused) or "a tiling rule"
            self.cycles_label.value = f"cycles: n/a (the tiling does not fit {what})"
            self.utilization_label.value = "cube: n/a, vector: n/a"
        else:
            self.cycles_label.value = (f"cycles: {r.cycles:.0f} ({r.time_us:,.2f} us, {r.tflops:,.1f} TFLOPS, "
                                       f"{r.bound}-bound by the roofline)")
            self.utilization_label.value = (f"cube: {100 * r.cube_utilization:.1f}%, "
                                            f"vector: {100 * r.vector_utilization:.1f}%")
        lines = []
        for o in self.overflows:
            colour = RED if o.refused else ORANGE
            note = "" if o.refused else " (the simulator plans this much and does not refuse it)"
            lines.append(f"<div class='pypto-overflow pypto-overflow-{o.buffer}' style='color:{colour};line-height:20px'>"
                         f"{html.escape(str(o))}{note}</div>")
        if r is None and not any(o.refused for o in self.overflows):
            lines.append(f"<div class='pypto-overflow' style='color:{RED};line-height:20px'>TilingError: "
                         f"{html.escape(str(self.error))}</div>")
        self.error_label.value = "".join(lines)
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
    def cycles_text(self) -> str:
        """``"cycles: 123456 (66.70 us, ...)"``, or ``"cycles: n/a (...)"`` when the tiling does not fit."""
        return self.cycles_label.value

    @property
    def utilization_text(self) -> str:
        return self.utilization_label.value

    @property
    def occupancy_text(self) -> str:
        """The per-buffer percentages, as plain text (``"L1: 75.0%, L0A: 100.0%, ..."``)."""
        return ", ".join(f"{b}: {100 * o['fraction']:.1f}%" for b, o in self.occupancy.items())

    @property
    def error_text(self) -> str:
        """One line per overflowing buffer with its fix (empty when every buffer fits)."""
        lines = [str(o) + ("" if o.refused else " (the simulator plans this much and does not refuse it)")
                 for o in self.overflows]
        if self.report is None and not any(o.refused for o in self.overflows):
            lines.append(f"TilingError: {self.error}")
        return "\n".join(lines)

    @property
    def text(self) -> str:
        """Everything the labels say, as plain text."""
        return "\n".join(t for t in (f"{self.title}, tile {self.tile}", self.cycles_text, self.utilization_text,
                                     self.occupancy_text, self.error_text) if t)

    def _repr_mimebundle_(self, **kwargs):
        return _static_bundle(self.widget, self.png(), self.text, DISPLAY_WIDTH_PX, **kwargs)


def _tile_str(tile: dict) -> str:
    if "m_l0" in tile:
        return str(CubeTile(**tile))
    return str(VecTile(**tile))


class TilingExplorer(_Explorer):
    """Tile sizes of one Cube kernel (``C[m, n] = A[m, k] @ B[k, n]``, ``batch`` copies) against
    the chip's buffers; see the module docstring for the rules and the handles."""

    buffers = views.TILING_BUFFERS

    def __init__(self, m: int, k: int, n: int, chip=DEFAULT_CHIP, dtype: str = "fp16", batch: int = 1,
                 epilogue: str = "none", tile: CubeTile | dict | None = None, double_buffer: bool = True,
                 core: int | None = None, render: bool = True, dpi: int = EXPLORER_DPI):
        super().__init__(chip, core, render, dpi)
        self.m, self.k, self.n, self.dtype, self.batch, self.epilogue = m, k, n, dtype, batch, epilogue
        self._epilogue = as_epilogue(self.chip, epilogue)
        if isinstance(tile, dict):
            tile = CubeTile(**tile)
        if tile is None:
            tile = CubeTile(**simulate_matmul(m, k, n, dtype=dtype, chip=self.chip, batch=batch,
                                              epilogue=epilogue).tile)
        self.default_tile = tile
        # PyPTO's alignment: 16 elements (fp16, bf16, fp32), 32 (int8); see plan_cube
        self.align = 32 if DTYPE_BYTES[dtype] == 1 else 16
        a = self.align
        values = tile.to_dict()
        self._hi = {}
        for d, dim in (("m", m), ("k", k), ("n", n)):
            hi = min(max(ceil_align(dim, a), 512 if d != "k" else 1024), 8192)
            self._hi[d] = ceil_align(max(hi, values[f"{d}_l0"], values[f"{d}_l1"]), a)
        bad = self._legal(values) != values
        if bad:
            raise TilingError(f"tile {tile} is not well-formed for {dtype}: every size must be a multiple of {a} and "
                              f"each *_l1 a multiple of its *_l0; e.g. {CubeTile(**self._legal(values))}")
        self._make_sliders(values)
        self.double_buffer.value = double_buffer
        self.title = f"matmul {m}x{k}x{n} {dtype} on {self.chip.name}" + (f" x{batch}" if batch > 1 else "")
        self._wire(self.title)

    def _ranges(self, values):
        a, out = self.align, {}
        for d in "mkn":
            hi, l0 = self._hi[d], values[f"{d}_l0"]
            out[f"{d}_l0"] = (a, hi, a, f"multiples of {a}, the {self.dtype} alignment, up to {hi}")
            l0 = min(max(l0, a), hi)
            out[f"{d}_l1"] = (l0, max(hi // l0, 2) * l0, l0, f"multiples of {d}_l0 = {l0}")
        return out

    def _legal(self, values):
        a, out = self.align, dict(values)
        for d in "mkn":
            l0 = out[f"{d}_l0"] = _nearest_multiple(out[f"{d}_l0"], a, a, self._hi[d])
            out[f"{d}_l1"] = _nearest_multiple(out[f"{d}_l1"], l0, l0, max(self._hi[d] // l0, 2) * l0)
        return out

    @property
    def tile(self) -> CubeTile:
        return CubeTile(**self.values)

    def _simulate(self):
        return simulate_matmul(self.m, self.k, self.n, dtype=self.dtype, chip=self.chip, tile=self.tile,
                               double_buffer=self.double_buffer.value, batch=self.batch, epilogue=self.epilogue)

    def _slot_bytes(self, tile: CubeTile) -> dict[str, int]:
        """Bytes of one tile in each buffer, by the tiling rules of `plan_cube` (L1, L0A, L0B,
        L0C; BT and FB where a FixPipe bias or quantisation needs them) and, where the Cube's
        output passes UB, the two UB slots the simulator plans for it (`hw.kernels`)."""
        need = cube_tile_bytes(tile, self.dtype, self.chip)
        fix = self._epilogue.fixpipe
        if "BT" in self.chip.buffers and "bias" in fix:
            need["BT"] = tile.n_l0 * 4
        if "FB" in self.chip.buffers and {"dequant", "quant"} & fix:
            need["FB"] = tile.n_l0 * 8
        if not self.chip.split_cores or self._epilogue.on_vector:
            need["UB"] = 2 * tile.m_l0 * tile.n_l0 * DTYPE_BYTES[self.chip.cube.accumulator[self.dtype]]
        return need

    def _requested(self) -> dict[str, int]:
        """Bytes the tiling needs per buffer, ping-pong slots included where two fit."""
        out = {}
        for b, nbytes in self._slot_bytes(self.tile).items():
            cap = self.chip.buffer(b).size_bytes
            two = self.double_buffer.value and 2 * nbytes <= cap and b not in ("BT", "FB", "UB")
            out[b] = 2 * nbytes if two else nbytes
        return out

    # the tile sizes each buffer's bytes grow with
    GROWS_WITH = {"L0A": ("m_l0", "k_l0"), "L0B": ("n_l0", "k_l0"), "L0C": ("m_l0", "n_l0"),
                  "L1": ("k_l1", "m_l1", "n_l1"), "BT": ("n_l0",), "FB": ("n_l0",), "UB": ("m_l0", "n_l0")}

    def _overflows(self) -> list[Overflow]:
        tile, values = self.tile, self.values
        need = self._slot_bytes(tile)
        if self.report is not None and "UB" in self.report.buffer_peak:
            need["UB"] = self.report.buffer_peak["UB"]
        out = []
        for b in [*self.buffers, "BT", "FB"]:
            if b not in need:
                continue
            cap = self.chip.buffer(b).size_bytes
            if need[b] <= cap:
                continue
            tries = []
            for name in self.GROWS_WITH[b]:
                lo, _, step, _ = self._ranges(values)[name]
                for v in range(values[name] - step, lo - 1, -step):  # the largest smaller value that fits
                    if self._slot_bytes(CubeTile(**self._legal({**values, name: v})))[b] <= cap:
                        tries.append(f"{name} = {v}")
                        break
            fix = "try " + " or ".join(tries) if tries else "no single tile size fixes it: shrink several"
            # the simulator refuses a tiling for L1, L0A/B/C, BT and FB, never for the UB it plans itself
            out.append(Overflow(b, int(need[b]), cap, fix, refused=self.report is None and b != "UB"))
        return out


class VectorTilingExplorer(_Explorer):
    """Tile (rows x cols elements) of one Vector kernel against UB; see the module docstring."""

    buffers = ("UB",)

    def __init__(self, op: str, numel: int, row_len: int | None = None, chip=DEFAULT_CHIP, dtype: str = "fp16",
                 tile: VecTile | dict | None = None, double_buffer: bool = True, core: int | None = None,
                 render: bool = True, dpi: int = EXPLORER_DPI):
        super().__init__(chip, core, render, dpi)
        if op not in VECTOR_OPS:
            raise ValueError(f"vector op {op!r} is not known; choose one of {', '.join(VECTOR_OPS)}")
        for name, v in (("numel", numel), ("row_len", row_len)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0):
                raise ValueError(f"{name} = {v!r}: it must be a positive whole number of elements")
        self.op, self.numel, self.dtype = op, numel, dtype
        self.spec = VECTOR_OPS[op]
        self.row_len = (row_len or min(numel, 1024)) if self.spec.row_wise else None
        if isinstance(tile, dict):
            tile = VecTile(**tile)
        if tile is None:
            tile = default_vec_tile(self.chip, numel, dtype, self.spec.live_buffers, self.row_len)
        self.default_tile = tile
        self.align = max(1, int(32 // DTYPE_BYTES[dtype]))  # the innermost dimension is 32-byte aligned
        self._cols_min = ceil_align(self.row_len, self.align) if self.row_len else self.align
        rows_max = max(tile.rows * 4, 64, max(1, numel // self.row_len) if self.row_len else 64)
        self._rows_max = min(max(rows_max, tile.rows), 4096)
        cols_max = max(tile.cols * 4, ceil_align(self.row_len or 1, self.align))
        self._cols_max = max(ceil_align(min(cols_max, 1 << 16), self.align), self._cols_min + self.align, tile.cols)
        values = tile.to_dict()
        if self._legal(values) != values:
            raise TilingError(f"vector tile {tile} is not well-formed: cols must be a multiple of {self.align} "
                              f"(32 bytes of {dtype}) and at least {self._cols_min}; e.g. {VecTile(**self._legal(values))}")
        self._make_sliders(values)
        self.double_buffer.value = double_buffer
        self.title = (f"{op} over {numel} {dtype}" + (f" (rows of {self.row_len})" if self.row_len else "")
                      + f" on {self.chip.name}")
        self._wire(self.title)

    def _ranges(self, values):
        row = f", at least the row of {self.row_len}" if self.row_len else ""
        return {"rows": (1, self._rows_max, 1, f"1 to {self._rows_max}"),
                "cols": (self._cols_min, self._cols_max, self.align,
                         f"multiples of {self.align} (32 bytes of {self.dtype}){row}")}

    def _legal(self, values):
        return {"rows": min(max(int(values["rows"]), 1), self._rows_max),
                "cols": _nearest_multiple(values["cols"], self.align, self._cols_min, self._cols_max)}

    @property
    def tile(self) -> VecTile:
        return VecTile(**self.values)

    def _simulate(self):
        return simulate_vector(self.op, self.numel, dtype=self.dtype, chip=self.chip, tile=self.tile,
                               double_buffer=self.double_buffer.value, row_len=self.row_len)

    def _ub_bytes(self, rows: int, cols: int) -> int:
        return int(rows * cols * DTYPE_BYTES[self.dtype] * self.spec.live_buffers)

    def _requested(self) -> dict[str, int]:
        return {"UB": self._ub_bytes(*self.values.values())}

    def _overflows(self) -> list[Overflow]:
        rows, cols = self.values["rows"], self.values["cols"]
        need, cap = self._ub_bytes(rows, cols), self.chip.buffer("UB").size_bytes
        if need <= cap:
            return []
        tries = []
        fit_rows = cap // self._ub_bytes(1, cols)
        if fit_rows >= 1:
            tries.append(f"rows = {fit_rows}")
        fit_cols = (cap // self._ub_bytes(rows, 1)) // self.align * self.align
        if fit_cols >= self._cols_min:
            tries.append(f"cols = {fit_cols}")
        fix = ("try " + " or ".join(tries)) if tries else "one row does not fit UB: split the row or use a smaller dtype"
        return [Overflow("UB", need, cap, f"{fix} ({self.spec.live_buffers} tiles live in UB)",
                         refused=self.report is None)]


def tiling_explorer(m: int, k: int, n: int, chip=DEFAULT_CHIP, dtype: str = "fp16", **kwargs) -> TilingExplorer:
    """The tiling explorer of a Cube kernel (see `TilingExplorer`)."""
    return TilingExplorer(m, k, n, chip=chip, dtype=dtype, **kwargs)


def vector_tiling_explorer(op: str, numel: int, row_len: int | None = None, chip=DEFAULT_CHIP,
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
    fusion graph (one repeated block, chosen in a dropdown, or the whole model), speedup
    waterfall from level 0, GM memory occupancy, on-chip buffer occupancy, swimlane (start
    kernel and count sliders), roofline, and the tiling explorer of a chosen Cube kernel.
    ``d.render(i)`` renders tab ``i`` now; ``d.figures[title]`` is the last Figure a tab drew.
    ``before`` (e.g. the model at level 0) is drawn beside the fusion graph, and when it is at
    level 0 the waterfall starts from it."""

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
        self.figures: dict[str, Figure] = {}
        self.explorer: TilingExplorer | None = None
        self.tab.observe(lambda ch: self.render(ch["new"]), names="selected_index")
        self.render(0)

    def _image(self, title: str, fig: Figure) -> W.Image:
        self.figures[title] = fig
        return figure_widget(fig)

    def _level0(self):
        """``before`` when it is the same run at level 0, else None (the waterfall works it out)."""
        if self.before is None:
            return None
        try:
            return views.level0_report(self.optimized, self.before)
        except ValueError:
            return None

    def render(self, i: int | None) -> None:
        if i is None or i in self.rendered:
            return
        self.rendered.add(i)
        om, rep = self.optimized, self.report
        page = self.pages[i]
        title = self.TITLES[i]
        if title == "fusion graph":
            blocks = views.repeated_blocks(om.graph)
            choice = W.Dropdown(options=[(b, b) for b in blocks] + [("whole model", "")],
                                value=views.default_block(om.graph) or "",
                                description="block")
            choice.add_class("pypto-block")
            out = W.VBox()

            def draw(*_):
                fig = views.plot_fusion_graph(om, before=self.before, block=choice.value or None)
                out.children = [self._image(title, fig)]

            choice.observe(draw, names="value")
            draw()
            page.children = [choice, out]
        elif title == "waterfall":
            page.children = [self._image(title, views.plot_speedup_waterfall(om, level0=self._level0()))]
        elif title == "GM memory":
            page.children = [self._image(title, views.plot_memory_occupancy(om))]
        elif title == "on-chip buffers":
            page.children = [self._image(title, views.plot_buffer_occupancy(rep))]
        elif title == "swimlane":
            start = W.IntSlider(value=0, min=0, max=max(len(rep.kernels) - 1, 1), description="start_kernel")
            count = W.IntSlider(value=5, min=1, max=20, description="count")
            out = W.VBox()

            def draw(*_):
                out.children = [self._image(title, views.plot_model_swimlane(om, start.value, count.value))]

            start.observe(draw, names="value")
            count.observe(draw, names="value")
            draw()
            page.children = [W.HBox([start, count]), out]
        elif title == "roofline":
            page.children = [self._image(title, views.plot_roofline(rep))]
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

    @property
    def text(self) -> str:
        rep = self.report
        return (f"dashboard of {rep.model} on {rep.chip.name}, level {rep.level}: "
                f"{rep.latency_us:,.1f} us, {len(rep.kernels)} kernels; tabs: {', '.join(self.TITLES)}")

    def _repr_mimebundle_(self, **kwargs):
        fig = self.figures.get(self.TITLES[0])
        png = figure_png(fig, dpi=100) if fig is not None else b""
        return _static_bundle(self.tab, png, self.text, **kwargs)


def dashboard(optimized, before=None) -> Dashboard:
    """The model's views in one ``ipywidgets.Tab`` (see `Dashboard`); ``d.tab`` is the widget."""
    return Dashboard(optimized, before)


__all__ = ["TilingExplorer", "VectorTilingExplorer", "tiling_explorer", "vector_tiling_explorer",
           "explorer_for_kernel", "Dashboard", "dashboard", "Overflow", "figure_png", "figure_widget"]
