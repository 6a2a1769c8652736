"""Analyses of an optimised model's kernels: when each runs (`schedule`) and the device memory
they need (`memory_plan`). Their results live in the `Report`."""
