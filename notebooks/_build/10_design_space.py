"""Generates notebooks/10_design_space.ipynb (run: .venv/bin/python notebooks/_build/10_design_space.py).

Design-space sweeps with `pypto_lab.explore`: chips derived from a preset, a sweep on a Dask
LocalCluster, which resource bounds which model, Pareto fronts of latency against an area proxy
(and energy when the report gives it), the on-disk cache, and the same call on a real cluster.
"""

from _notebook import Notebook

NB = Notebook()
md, code = NB.md, NB.code


md("""
# 10 · The design space: which resource bounds which model

Every chip in this workbench is data: a preset (`pypto_lab/hw/presets/*.toml`) names each constant
with its public source. So a question an architect asks, *what if the chip had twice the HBM
bandwidth, a bigger L1, fewer AI Cores?*, is a question the simulator can answer: derive a chip
from a preset with one number changed, run the model on it, compare.

`pypto_lab.explore.sweep` does that for a whole grid at once, on **Dask**:

```python
sweep(models, chips, variants={"hbm_gbps": [...], "ai_cores": [...], "l1_kb": [...]},
      batch=[...], level=[...], client=None)
```

returns a pandas DataFrame with one row per design point (latency, throughput, energy when the
report has it, peak memory, which resource bounds the model, an area proxy, and the variant's
values). The points run on a `LocalCluster` of worker processes here, on any Dask cluster with
`client=` or `scheduler="tcp://host:8786"`. Rows are cached on disk, so a rerun computes only the
points it has not seen.

This notebook:

1. derives chips from the Ascend 910B1 preset, and shows that an impossible variant gets the preset's own error;
2. sweeps two models over HBM bandwidth, AI Cores and L1 size;
3. reads off **which resource bounds which model**;
4. draws the **Pareto fronts**: latency against a silicon-area proxy;
5. reruns from the cache, and shows the same call on a multi-node cluster.

Every figure is computed by the simulator or measured here; none is typed in.
""")

code("""
%matplotlib inline
import tempfile
import time

import matplotlib.pyplot as plt
import pandas as pd
from distributed import Client, LocalCluster

from pypto_lab import ChipConfigError, get_chip
from pypto_lab import explore as ex

BASE = "Ascend910B1"
CACHE_DIR = tempfile.TemporaryDirectory(prefix="pypto_sweep_")   # removed when the kernel stops
CACHE = CACHE_DIR.name   # a fresh cache: this notebook computes every point once
pd.set_option("display.width", 140)
""")

# ---------------------------------------------------------------- variants
md("""
## 1 · Chips derived from a preset

`variant_chip(preset, **values)` edits the preset's TOML document and loads it through the **same
validation** as any preset file. Its name says what changed. The keys a variant can change are in
`ex.VARIANT_KEYS`:
""")

code("""
for key, (where, scale, meaning) in ex.VARIANT_KEYS.items():
    print(f"{key:13s} -> {'.'.join(where):24s} {meaning}")
""")

code("""
base = get_chip(BASE)
big = ex.variant_chip(BASE, hbm_gbps=3200, l1_kb=1024)
print(repr(base), "fingerprint", base.fingerprint)
print(repr(big), "fingerprint", big.fingerprint)
print("HBM", base.hbm_gbps, "->", big.hbm_gbps, "GB/s;  L1", base.buffer("L1").size_bytes // 1024, "->",
      big.buffer("L1").size_bytes // 1024, "KB")
""")

md("""
An impossible chip is refused exactly as a broken preset file would be: the message names the
derived chip, the key, the value, the rule and a fix. An unknown key names the valid ones.
""")

code("""
for bad in ({"l1_kb": 0}, {"cube_cores": 2.5}, {"l3_mb": 64}):
    try:
        ex.variant_chip(BASE, **bad)
    except (ChipConfigError, ex.SweepError) as exc:
        print(f"{type(exc).__name__}: {exc}\\n")
""")

# ---------------------------------------------------------------- sweep
md("""
## 2 · A sweep on a Dask LocalCluster

Two models, each built by the workers themselves (only their builder functions travel to them):

* `mlp`: a 1024 → 4096 → 1024 GELU MLP on 8 rows. Its work is small and its 8 M weights must all
  come from HBM on every run;
* `resnet18`: torchvision's ResNet-18 on a batch of 8 images, 224 x 224.

The grid: HBM bandwidth 800 / 1,600 / 3,200 GB/s (the preset has 1,600) x 12 / 24 AI Cores (the preset
has 24; `ai_cores` keeps the preset's two vector cores per AI Core) x L1 512 / 1,024 KB (the
preset has 512): 12 chips, 24 points.

Without `client=`, `sweep` starts a `LocalCluster` of worker processes (one per core) and closes it
at the end. Each of those processes imports torch and builds the models once, which costs tens of
seconds on this 2-core machine; to keep the notebook quick it runs its sweeps on one Dask worker
inside this process (`processes=False`) instead. The call is the same; `benchmarks/bench_sweep.py`
measures the worker processes.
""")

code("""
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
client = Client(cluster)
GRID = {"hbm_gbps": [800, 1600, 3200], "ai_cores": [12, 24], "l1_kb": [512, 1024]}
MODELS = {"mlp": ex.mlp, "resnet18": ex.resnet18}
BATCH = {"mlp": 8, "resnet18": 8}

start = time.perf_counter()
df = pd.concat([ex.sweep({name: m}, BASE, GRID, batch=BATCH[name], level=1, client=client, cache_dir=CACHE)
                for name, m in MODELS.items()], ignore_index=True)
first_run = time.perf_counter() - start
print(f"{len(df)} design points on {len(client.scheduler_info()['workers'])} workers")
df[["model", "chip", "batch", "latency_us", "throughput_per_s", "energy_mj", "peak_memory_bytes", "bound",
    "area_mm2"]].head(6)
""")

# ---------------------------------------------------------------- bounds
md("""
## 3 · Which resource bounds which model

Two ways to read it. The simulator labels every kernel by its roofline (compute-bound on the Cube
or the Vector units, or bound by GM traffic); the `*_bound_share` columns are the shares of the
model's kernel time under each label, on the unchanged preset. And the sweep itself: how much
faster does each model get when one resource **doubles**, the others kept at the preset's value?
""")

code("""
is_base = (df.hbm_gbps == 1600) & (df.ai_cores == 24) & (df.l1_kb == 512)
shares = df[is_base].set_index("model")[["latency_us", "cube_bound_share", "vector_bound_share",
                                          "memory_bound_share", "bound"]]
shares.round(3)
""")

code("""
def latency(model, hbm=1600, cores=24, l1=512):
    row = df[(df.model == model) & (df.hbm_gbps == hbm) & (df.ai_cores == cores) & (df.l1_kb == l1)]
    return float(row.latency_us.iloc[0])

gain = pd.DataFrame({
    "HBM 1,600 -> 3,200 GB/s": {m: latency(m) / latency(m, hbm=3200) for m in MODELS},
    "AI Cores 12 -> 24": {m: latency(m, cores=12) / latency(m) for m in MODELS},
    "L1 512 -> 1,024 KB": {m: latency(m) / latency(m, l1=1024) for m in MODELS},
})
print("speed-up when one resource doubles (latency before / after):")
print(gain.round(3).to_string())
for m in MODELS:
    top = gain.loc[m].idxmax()
    print(f"{m:9s}: bounded most by {top.split(' ')[0] if not top.startswith('AI') else 'AI Cores'} "
          f"(x{gain.loc[m].max():.2f}); kernel time memory-bound {shares.loc[m, 'memory_bound_share']:.0%}")
""")

md("""
How to read it:

* a model whose kernels are memory-bound gains from HBM bandwidth and hardly from cores: each
  core waits on GM, so more of them only wait longer together. The MLP is the extreme case: its
  weights cross HBM once per run whatever the chip computes;
* a model whose time sits in compute-bound kernels gains from AI Cores (more blocks of its
  matmuls and convolutions run at once) and little from bandwidth;
* L1 decides which tilings are legal and how often a tile must be fetched again. A bigger L1 does
  not speed these two models up at level 1; the simulator even finds them a few per cent slower
  (third column). Level 1 picks its tiles from the buffer sizes by a roofline estimate, not by
  simulating them, so a bigger L1 can lead it to tiles the simulation finds slower; level 3's
  tiling search (`tune_tiling`) chooses against the simulation. Try `level=3` on one model.

Change `BATCH` and rerun: at larger batches every model moves toward the Cube.
""")

code("""
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for m in MODELS:
    sub = df[(df.model == m) & (df.ai_cores == 24) & (df.l1_kb == 512)].sort_values("hbm_gbps")
    axes[0].plot(sub.hbm_gbps, latency(m) / sub.latency_us, "o-", label=m)
    sub = df[(df.model == m) & (df.hbm_gbps == 1600) & (df.l1_kb == 512)].sort_values("ai_cores")
    axes[1].plot(sub.ai_cores, latency(m) / sub.latency_us, "o-", label=m)
axes[0].set_xlabel("HBM GB/s (24 AI Cores, L1 512 KB)")
axes[1].set_xlabel("AI Cores (HBM 1,600 GB/s, L1 512 KB)")
for ax in axes:
    ax.set_ylabel("speed vs the 910B1 preset")
    ax.axhline(1, color="grey", lw=0.5)
    ax.legend()
plt.tight_layout()
""")

# ---------------------------------------------------------------- pareto
md("""
## 4 · Pareto fronts: latency against silicon area

A faster chip is bigger. `ex.area_proxy_mm2(chip)` is a **relative** area proxy:

    cube_cores x (fp16 MACs/cycle / 4096) x CUBE_MM2_PER_4096_MACS + vector_cores x VECTOR_CORE_MM2
    + SRAM MB x SRAM_MM2_PER_MB + hbm_gbps x HBM_PHY_MM2_PER_GBPS

The SRAM density is TSMC's published 7 nm high-density bit cell (0.027 µm², IEDM 2016) at an
assumed 70 % array efficiency; the logic and HBM PHY constants are assumptions, so it ranks design
points against each other and is not a die size. `ex.pareto(df, x, y)` keeps the points no other
point beats on both; `ex.plot_pareto` draws every point (faint) and each model's front.
""")

code("""
print(f"SRAM: {ex.SRAM_MM2_PER_MB:.3f} mm2/MB; Cube: {ex.CUBE_MM2_PER_4096_MACS} per 4,096 MACs (assumed); "
      f"HBM PHY: {ex.HBM_PHY_MM2_PER_GBPS:.4f} per GB/s (assumed)")
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for ax, m in zip(axes, MODELS):
    ex.plot_pareto(df[df.model == m], x="area_mm2", y="latency_us", by="model", ax=ax)
    ax.set_title(m)
plt.tight_layout()
""")

code("""
front = ex.pareto(df, "area_mm2", "latency_us", by="model")
front[["model", "chip", "area_mm2", "latency_us", "bound"]].round(2)
""")

md("""
Read the fronts model by model: the chips on a model's front are where its area is well spent.
For the memory-bound MLP the cheap way down is HBM bandwidth; the AI Cores and L1 it does not use
are area it pays for and gets little from, so its front runs through the 12-core chips until the
bandwidth runs out. ResNet-18 at batch 8 is split between the Cube and GM (the table in §3): its
front takes bandwidth first, while it is cheap, then AI Cores. No chip with the bigger L1 is on
either front.

**Energy.** `energy_mj` is the simulated energy of one run: pJ per MAC and per byte moved at each
memory level, plus the card's static power for the run's duration (`pypto_lab.hw.energy`; its
constants and their sources are in `docs/energy.md`). A variant keeps its preset's energy
constants, so a faster chip spends less static energy per run, and more bandwidth does not cost
energy here: read this front as "which resources pay for themselves in energy", not as a power
budget.
""")

code("""
ax = ex.plot_pareto(df.dropna(subset=["energy_mj"]), x="energy_mj", y="latency_us", by="model")
ax.set_title("latency against energy per run")
""")

# ---------------------------------------------------------------- cache
md("""
## 5 · The cache, and the same call on a cluster

Each row was written to `CACHE` as it came back, keyed by the model, the chip's fingerprint (every
constant), batch, level, precision and the versions of pypto_lab and torch. The same sweep again
computes nothing; a new point computes only itself.
""")

code("""
start = time.perf_counter()
again = pd.concat([ex.sweep({name: m}, BASE, GRID, batch=BATCH[name], level=1, client=client, cache_dir=CACHE,
                            progress=False) for name, m in MODELS.items()], ignore_index=True)
rerun = time.perf_counter() - start
print(f"first run {first_run:.1f} s (wall); rerun {rerun:.2f} s (wall), all from the cache: {again.from_cache.all()}")
assert (again.latency_us.values == df.latency_us.values).all()
""")

md("""
On a real cluster the call is the same, with the cluster's scheduler instead of the local one.
On the scheduler's node run `dask-scheduler`; on every worker node, with pypto_lab installed in the
same version, `dask-worker tcp://scheduler-host:8786 --nthreads 1 --nworkers 8`; then

```python
from distributed import Client
df = ex.sweep(models, chips, variants, client=Client("tcp://scheduler-host:8786"))
# or: ex.sweep(models, chips, variants, scheduler="tcp://scheduler-host:8786")
```

The client reads and writes the cache; the workers only simulate (`benchmarks/README.md`, *Design-space
sweeps*, has the measured points per second and more on clusters).
""")

code("""
client.close()
cluster.close()
""")

md("""
### Try

* add `"ub_kb": [96, 192]` or `"clock_mhz": [1500, 1850]` to `GRID`: which model cares about each?
* sweep `batch=[1, 8, 32]` for `resnet18`: where does it leave HBM for the Cube?
* give `chips=["Ascend910B1", "Ascend910B4"]`: the fronts of two presets in one table.
""")

NB.write("10_design_space.ipynb")
