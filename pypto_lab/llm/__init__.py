"""Large language models on the simulated chip: configs, prefill and decode costs with a KV cache,
serving, and more than one card.

* `simulate_generation(model, batch, prompt_len, output_len, chip, cards=1, tp=None, precision)`:
  TTFT, TPOT, throughput, HBM per card, communication, roofline (`LLMReport`);
* `serve(model, chip, requests, rate, ...)`: continuous batching over a Poisson arrival stream;
* `spec_of(model)`: the architecture the engine reads from a name, a config or a module;
* `HBMCapacityError`: what does not fit, and what would.
"""

from .configs import KNOWN_MODELS, LLMConfigError, LLMSpec, known_models, spec_of
from .engine import LLMReport, hardware, largest_batch, serve, simulate_generation, step_model
from .forward import Hardware, forward_kernels
from .memory import HBMCapacityError
from .serving import ServeReport, ServingConfigError, simulate_serving

__all__ = ["KNOWN_MODELS", "HBMCapacityError", "Hardware", "LLMConfigError", "LLMReport", "LLMSpec",
           "forward_kernels", "hardware", "known_models", "largest_batch", "serve", "ServeReport", "ServingConfigError",
           "simulate_generation", "simulate_serving", "spec_of", "step_model"]
