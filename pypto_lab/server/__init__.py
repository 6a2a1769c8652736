"""The serving twin: an OpenAI-compatible HTTP server whose answers leave at the times a simulated
Ascend card would produce them, with vLLM's Prometheus metrics (`pypto-lab serve MODEL --http PORT`).

* `TwinServer(model, chip, cards, ...)`: the server in a background thread, as a context manager;
* `serve_http(...)`: the same in the foreground (the CLI);
* `app`: the FastAPI routes; `bridge`: the engine thread over `pypto_lab.llm.online.OnlineScheduler`;
  `card`: the step model with the card's own figures; `metrics`: the Prometheus registry;
  `text`: the tokenizer and the deterministic answers.
"""

from .run import LOOPBACK, TwinServer, build_twin, serve_http

__all__ = ["LOOPBACK", "TwinServer", "build_twin", "serve_http"]
