"""Models the workbench builds: `zoo` (the models the command line knows by name, ``hf:NAME``
causal LMs) and `nn` (modules written the way the NPU likes them, e.g. `FusedBERTLayer`)."""
