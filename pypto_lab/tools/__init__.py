"""Tools for an optimised model, as the seed article names them: `profiler` (torch.profiler's
shape over the simulated NPU), `debug` (layer-by-layer numerics against fp32) and `tuning`
(`auto_tune`, the tiling search)."""
