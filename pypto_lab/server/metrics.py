"""The server's Prometheus metrics, written with ``prometheus_client`` in its own registry (one per
server): vLLM's names where vLLM has the metric, ``pypto_lab:`` names for the simulated card's own.

Every latency is **simulated** seconds on the card (what the card would take), whatever
``--time-scale`` stretches or shrinks the wall clock by; ``pypto_lab:token_release_lag_seconds``
says how late, in wall seconds, the server released tokens against that schedule. Labels:
``model_name`` (the served model) and ``engine`` ("0"), as vLLM labels its own.

vLLM's names used (its V1 engine's metric names; ``_total`` is added to counters by the client
library as by vLLM's): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (and the older ``vllm:gpu_cache_usage_perc``, the same value),
``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total{finished_reason}``, and the histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (each gap between two
tokens), ``vllm:time_per_output_token_seconds`` (the same gaps, under the older name),
``vllm:request_time_per_output_token_seconds`` (one mean per request),
``vllm:e2e_request_latency_seconds``,
``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``, ``vllm:iteration_tokens_total``.
The bucket boundaries are this module's own (roughly x2 steps over the range each covers).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.25, 2.5, 5.0, 10.0, 20.0, 40.0,
                   80.0, 160.0, 320.0, 640.0, 1280.0)
TOKEN_GAP_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.25,
                     0.5, 1.0, 2.5, 5.0, 10.0)
TOKEN_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class Metrics:
    """The metric objects, labelled for one served model; ``exposition()`` is the text format."""

    def __init__(self, model_name: str):
        r = self.registry = CollectorRegistry(auto_describe=True)
        lab = ("model_name", "engine")
        v = (model_name, "0")

        def gauge(name, doc, labels=lab):
            return Gauge(name, doc, labels, registry=r)

        def counter(name, doc, labels=lab):
            return Counter(name, doc, labels, registry=r)

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(*v)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.").labels(*v)
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be admitted.").labels(*v)
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of the KV-cache blocks in use (1 = full).").labels(*v)
        self.gpu_cache = gauge("vllm:gpu_cache_usage_perc", "The same as vllm:kv_cache_usage_perc (older name).").labels(*v)
        self.preemptions = counter("vllm:num_preemptions", "Sequences preempted (recompute mode).").labels(*v)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled, counted once per request.").labels(*v)
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.").labels(*v)
        self._success = counter("vllm:request_success", "Requests finished, by reason.", lab + ("finished_reason",))
        self._success_v = v
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (simulated s).", LATENCY_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Gap between two tokens of a request (simulated s).",
                        TOKEN_GAP_BUCKETS)
        self.tpot_gap = hist("vllm:time_per_output_token_seconds",
                             "Gap between two tokens of a request (simulated s; older name).", TOKEN_GAP_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Mean time per output token after the first, per request (simulated s).", TOKEN_GAP_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token (simulated s).", LATENCY_BUCKETS)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_COUNT_BUCKETS)
        self.req_gen = hist("vllm:request_generation_tokens", "Generated tokens per request.", TOKEN_COUNT_BUCKETS)
        self.iteration_tokens = hist("vllm:iteration_tokens_total", "Tokens run per engine step.", TOKEN_COUNT_BUCKETS)
        # the simulated card's own
        self.aicore_busy = gauge("pypto_lab:aicore_busy_ratio",
                                 "Share of the last engine step the AI Cores ran kernels.").labels(*v)
        self.aicore_busy_s = counter("pypto_lab:aicore_busy_seconds",
                                     "AI Core kernel time (simulated s); rate() over "
                                     "rate(pypto_lab:engine_step_seconds_total) is the busy share.").labels(*v)
        self.step_s = counter("pypto_lab:engine_step_seconds", "Simulated time spent in engine steps.").labels(*v)
        self.steps = counter("pypto_lab:engine_steps", "Engine steps (forward passes) run.").labels(*v)
        self.hbm_bw = gauge("pypto_lab:hbm_bandwidth_bytes_per_second",
                            "HBM bytes moved per simulated second in the last engine step.").labels(*v)
        self.hbm_bw_ratio = gauge("pypto_lab:hbm_bandwidth_ratio",
                                  "The last step's HBM bandwidth over the chip's peak.").labels(*v)
        self.hbm_bytes = counter("pypto_lab:hbm_transferred_bytes", "HBM bytes moved by the steps' kernels.").labels(*v)
        self.hbm_used = gauge("pypto_lab:hbm_used_bytes", "HBM per card in use: weights, activation reserve and "
                              "the KV blocks held.").labels(*v)
        self.hbm_capacity = gauge("pypto_lab:hbm_capacity_bytes", "HBM per card the engine may use "
                                  "(hbm_utilization x the chip's HBM).").labels(*v)
        self.kv_blocks = gauge("pypto_lab:kv_cache_blocks", "KV-cache blocks in the pool.").labels(*v)
        self.kv_used = gauge("pypto_lab:kv_cache_used_blocks", "KV-cache blocks held by running sequences.").labels(*v)
        self.sim_time = gauge("pypto_lab:simulated_time_seconds", "The engine's simulated clock.").labels(*v)
        self.time_scale = gauge("pypto_lab:time_scale", "Wall seconds per simulated second.").labels(*v)
        self.lag = hist("pypto_lab:token_release_lag_seconds",
                        "How late (wall s) a step's tokens left against the simulated schedule.", LAG_BUCKETS)
        self._rejected = counter("pypto_lab:requests_rejected", "Requests refused, by reason.", lab + ("reason",))
        self.cancelled = counter("pypto_lab:requests_cancelled",
                                 "Requests dropped before their end (the client went away).").labels(*v)

    def success(self, reason: str) -> None:
        self._success.labels(*self._success_v, reason).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(*self._success_v, reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["Metrics"]
