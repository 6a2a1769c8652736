"""Large language models on the simulated chip: configs, prefill and decode costs with a KV cache,
serving, and more than one card. (Public names are re-exported here as the modules land.)"""
