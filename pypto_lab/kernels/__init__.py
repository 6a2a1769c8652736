"""The kernel IR between the passes and the chip, and one coster per kind of kernel."""
