"""Starting the serving twin: `TwinServer`, a context manager that runs it on uvicorn in a
background thread (for notebooks and tests), and `serve_http`, the blocking call behind
``pypto-lab serve MODEL --http PORT``.

```python
from pypto_lab.server import TwinServer
with TwinServer("llama-3-8b", chip="Ascend910B1") as srv:      # 127.0.0.1, a free port
    client = openai.OpenAI(base_url=srv.base_url, api_key="none")
    client.chat.completions.create(model=srv.model, messages=[...], stream=True)
```

It binds 127.0.0.1 unless told otherwise: the API has no authentication, so another address is
the user's explicit choice (the CLI prints a warning for it). ``time_scale`` stretches the wall
clock: wall seconds = simulated seconds x ``time_scale`` (1: the card's own speed). On leaving the
``with`` block the server stops taking requests and, with ``drain=True``, lets the running streams
finish (up to ``drain_timeout`` s) before it closes; ``drain=False`` ends them with an error event.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import sys
import threading
import time
from typing import Any

from ..hw.chip import DEFAULT_CHIP, Chip
from ..llm.configs import LLMConfigError
from ..llm.memory import DEFAULT_HBM_UTILIZATION
from ..llm.serving import simulate_serving
from ..stack import Stack
from ..stack.preset import DEFAULT_LLM_STACK
from .app import Twin, build_app
from .bridge import Engine
from .card import card_step_model
from .metrics import Metrics

LOOPBACK = "127.0.0.1"
# The engine thread costs steps in pure Python while the event loop serves HTTP: with Python's
# default GIL switch interval (5 ms) a request arriving during a costing waits up to that long per
# turn before it is stamped. The server runs with this shorter one (restored when a TwinServer stops).
SWITCH_INTERVAL_S = 0.0005


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check(name: str, value, ok: bool, rule: str, fix: str) -> None:
    if not ok:
        raise LLMConfigError(f"{name} = {value!r}: {rule}. Fix: {fix}")


def build_twin(model, chip: str | Chip = DEFAULT_CHIP, cards: int = 1, *, stack: str | Stack = DEFAULT_LLM_STACK,
               precision: str = "fp16", kv_dtype: str | None = None, time_scale: float = 1.0,
               max_batched_tokens: int = 8192, max_num_seqs: int = 256, block_size: int = 128,
               max_waiting: int = 1024, seed: int = 0, hbm_utilization: float = DEFAULT_HBM_UTILIZATION,
               served_model_name: str | None = None, drain_timeout: float = 30.0, warmup: int = 0):
    """(FastAPI app, `Twin`) for ``model`` on ``cards`` x ``chip``: the card, its engine, its metrics.
    ``warmup``: serve that many ShareGPT-like requests offline first (`simulate_serving`, all at
    t=0), so the kernels of typical steps are costed before a client waits on them."""
    _check("time_scale", time_scale, isinstance(time_scale, (int, float)) and 0 < time_scale < float("inf"),
           "wall seconds per simulated second must be a positive number", "time_scale=1 (the card's speed), 0.1 "
           "(ten times faster)")
    _check("warmup", warmup, isinstance(warmup, int) and warmup >= 0,
           "the requests served offline before starting are a whole number", "warmup=0 (none) or e.g. 64")
    _check("max_waiting", max_waiting, isinstance(max_waiting, int) and max_waiting >= 1,
           "the bound on requests waiting for admission is a positive integer", "max_waiting=1024")
    card = card_step_model(model, chip, cards, precision, kv_dtype=kv_dtype, stack=stack,
                           max_batched_tokens=max_batched_tokens, hbm_utilization=hbm_utilization)
    card.step_ms([(block_size, 0)], [])    # the first costing in a process loads the simulator: not on a client
    card.step_ms([], [block_size])
    if warmup:
        simulate_serving(card, requests=warmup, rate=float("inf"), seed=seed, max_batched_tokens=max_batched_tokens,
                         max_num_seqs=max_num_seqs, block_size=block_size, progress=False)
    name = served_model_name or (model if isinstance(model, str) else card.spec.name)
    metrics = Metrics(name)
    engine = Engine(card, metrics, model_name=name, time_scale=time_scale, max_batched_tokens=max_batched_tokens,
                    max_num_seqs=max_num_seqs, block_size=block_size, max_waiting=max_waiting)
    twin = Twin(engine, name, card.spec.max_positions, seed)
    info: dict[str, Any] = {
        "model": name, "step_model": card.name, "chip": card.hw.chip.name, "cards": card.hw.cards, "tp": card.hw.tp,
        "stack": card.hw.stack.name, "precision": card.hw.precision, "kv_dtype": card.hw.kv_dtype,
        "max_positions": card.spec.max_positions, "max_batched_tokens": max_batched_tokens,
        "max_num_seqs": max_num_seqs, "block_size": block_size, "max_waiting": max_waiting,
        "kv_bytes_per_token": card.kv_bytes_per_token, "kv_budget_bytes": card.kv_budget_bytes,
        "hbm_capacity_bytes": card.capacity_bytes, "weights_bytes": card.weights_bytes,
        "activation_bytes": card.activation_bytes, "seed": seed,
    }
    return build_app(twin, info, drain_timeout=drain_timeout), twin


class TwinServer:
    """The serving twin on uvicorn in a background thread; ``url``, ``base_url`` (``.../v1``),
    ``model`` and ``engine`` once started. Keyword arguments go to `build_twin`."""

    def __init__(self, model, chip: str | Chip = DEFAULT_CHIP, cards: int = 1, *, host: str = LOOPBACK, port: int = 0,
                 drain: bool = True, drain_timeout: float = 30.0, log_level: str = "warning", **kwargs):
        self.host, self.port, self.drain, self.drain_timeout = host, port, drain, drain_timeout
        self.app, self.twin = build_twin(model, chip, cards, drain_timeout=drain_timeout, **kwargs)
        self.model = self.twin.model_name
        self.engine = self.twin.engine
        self.log_level = log_level
        self._server = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._switch: float | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self, timeout: float = 60.0) -> TwinServer:
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, access_log=False, lifespan="on",
                                timeout_graceful_shutdown=self.drain_timeout if self.drain else 0.0)
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            except BaseException as exc:  # shown by start() or stop()
                self._error = exc
            finally:
                sock.close()

        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=run, name=f"pypto-lab-server:{self.port}", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"the serving twin did not start on {self.url} within {timeout} s"
                                   + (f": {self._error!r}" if self._error else "")
                                   + ". Fix: look at the log above; another port (port=0 picks a free one)")
            time.sleep(0.01)
        return self

    def stop(self, drain: bool | None = None) -> None:
        """Stop taking requests, finish (``drain``) or end the running ones, close the port."""
        drain = self.drain if drain is None else drain
        if self._server is None:
            return
        if not drain:
            self.engine.stop(drain=False, timeout=5.0)
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.drain_timeout + 30.0)
        self.engine.stop(drain=drain, timeout=5.0)
        if self._switch is not None:
            sys.setswitchinterval(self._switch)
            self._switch = None

    def __enter__(self) -> TwinServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_http(model, chip: str | Chip = DEFAULT_CHIP, cards: int = 1, *, host: str = LOOPBACK, port: int = 8000,
               drain_timeout: float = 30.0, log_level: str = "info", **kwargs) -> None:
    """Run the twin until interrupted (Ctrl-C / SIGTERM: uvicorn drains, then the engine stops).
    Each finished or cancelled request is logged as one JSON line on stderr at ``log_level`` info."""
    import uvicorn

    logger = logging.getLogger("pypto_lab.server")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(log_level.upper())

    app, twin = build_twin(model, chip, cards, drain_timeout=drain_timeout, **kwargs)
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout,
                access_log=False)


__all__ = ["LOOPBACK", "TwinServer", "build_twin", "is_loopback", "serve_http"]
