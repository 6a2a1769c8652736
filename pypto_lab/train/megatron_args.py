"""A Megatron-LM / MindSpeed / ModelLink training run read from its command line, as the example
scripts write it (``pretrain_gpt.py $GPT_ARGS``), and simulated with `simulate_step`.

`read_megatron_args(argv)` takes the argument list (a list of strings, or one string of a shell
script's ``GPT_ARGS``, ``\\`` line ends and all) and returns a `MegatronRun`: the model as a
transformers config and the layout and options `simulate_step` takes. Arguments read:

* model: ``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``,
  ``--group-query-attention`` with ``--num-query-groups``, ``--seq-length``,
  ``--max-position-embeddings``, ``--swiglu``, ``--normalization``, ``--position-embedding-type``,
  ``--untie-embeddings-and-output-weights``, ``--disable-bias-linear``, ``--num-experts`` with
  ``--moe-router-topk`` (the experts always run as GroupedMatmul kernels, ``--moe-grouped-gemm``'s
  path; `pypto_lab.train.moe`), the vocabulary (``--vocab-size``, ``--padded-vocab-size``, else the
  tokenizer's: Llama-2's 32,000, GPT-2's 50,257), padded as Megatron pads it (``_vocab_size_with_padding``:
  a multiple of ``--make-vocab-size-divisible-by`` (128) x tensor-parallel size);
* layout: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--num-layers-per-virtual-pipeline-stage`` / ``--virtual-pipeline-model-parallel-size``,
  ``--context-parallel-size``, ``--expert-model-parallel-size``, ``--micro-batch-size`` and
  ``--global-batch-size`` (the micro-batches per step follow from the cards),
  ``--sequence-parallel``, ``--use-distributed-optimizer``, ``--overlap-grad-reduce``,
  ``--overlap-param-gather``, ``--recompute-granularity``, ``--recompute-method``,
  ``--recompute-num-layers``, ``--recompute-activations`` (selective), ``--checkpoint-activations``
  (Megatron-DeepSpeed's full recomputation of every layer), ``--zero-stage`` (Megatron-DeepSpeed);
* precision and kernels: ``--bf16`` / ``--fp16``, ``--use-flash-attn``, ``--use-fused-rmsnorm``,
  ``--use-fused-swiglu``, ``--use-fused-rotary-pos-emb`` (fused Vector chains), ``--use-mc2``.

Arguments that do not change the cost (learning rate, data paths, logging) are ignored; an
argument that changes it but is not modelled is listed in ``ignored``. Megatron reduces gradients
in fp32 under ``--bf16`` (``arguments.py`` sets ``accumulate_allreduce_grads_in_fp32``) and, with
``--overlap-grad-reduce``, in buckets of ``max(40,000,000, 1,000,000 x data-parallel size)``
parameters (``megatron/core/distributed``, ``DistributedDataParallelConfig.bucket_size``);
without it, in one go after the backward.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import torch

from .step import TrainConfigError, TrainReport, simulate_step

_FLAGS = {"--no-gradient-accumulation-fusion", "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--bf16", "--fp16", "--use-flash-attn", "--use-fused-rmsnorm", "--use-fused-swiglu",
          "--use-fused-rotary-pos-emb", "--use-mc2", "--swiglu", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear", "--group-query-attention", "--checkpoint-activations", "--recompute-activations",
          "--use-mcore-models", "--deepspeed", "--deepspeed-activation-checkpointing", "--add-qkv-bias",
          "--moe-grouped-gemm"}
# arguments that change the cost but are not modelled: reported, never silently dropped
_NOT_MODELLED = {"--swap-attention", "--reuse-fp32-param", "--use-fused-ring-attention-update", "--cpu-offload",
                 "--noop-layers", "--num-layer-list", "--use-ascend-coc", "--moe-alltoall-overlap-comm"}
TOKENIZER_VOCAB = {"Llama2Tokenizer": 32000, "GPT2BPETokenizer": 50257}


class MegatronArgsError(TrainConfigError):
    """An argument list that cannot be simulated; the message names the argument, the rule and a fix."""


@dataclass
class MegatronRun:
    """A Megatron run: the model (a transformers config), its sequence length and batch sizes, and
    the options `simulate_step` takes."""

    config: Any
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None
    options: dict[str, Any]
    args: dict[str, Any] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    def batch(self) -> dict[str, torch.Tensor]:
        """One micro-batch of token ids (values do not change the cost)."""
        ids = torch.zeros(self.micro_batch_size, self.seq_length, dtype=torch.long)
        return {"input_ids": ids}

    def layout(self, cards: int) -> dict[str, Any]:
        """The options for ``cards`` cards: data parallelism and micro-batches per step follow."""
        o = dict(self.options)
        model = o["tp"] * o.get("pp", 1) * o.get("cp", 1)
        if cards % model:
            raise MegatronArgsError(f"cards = {cards} with tensor x pipeline x context parallel = {model}: the world "
                                    f"size must be a multiple of it. Fix: cards = {max(model, cards // model * model)}")
        dp = cards // model
        if self.global_batch_size is not None:
            per = self.micro_batch_size * dp
            if self.global_batch_size % per:
                raise MegatronArgsError(f"--global-batch-size {self.global_batch_size} is not a multiple of "
                                        f"--micro-batch-size {self.micro_batch_size} x data-parallel size {dp}. "
                                        "Rule: Megatron's micro-batch calculator. Fix: a global batch that is")
            o["micro_batches"] = self.global_batch_size // per
        if o.pop("_megatron_buckets", False):
            o["bucket_mb"] = max(40_000_000, 1_000_000 * dp * o.get("cp", 1)) * (4 if o.get("fp32_grads") else 2) \
                / 2 ** 20 if o.get("overlap_grad_reduce") else 1e9
        o["cards"] = cards
        return o

    def simulate(self, cards: int, chip: str = "Ascend910B2", **overrides) -> TrainReport:
        """`simulate_step` of this run on ``cards`` cards of ``chip`` (``overrides`` replace options)."""
        o = {**self.layout(cards), **overrides}
        return simulate_step(self.config, self.batch(), chip=chip, **o)


def _tokens(argv) -> list[str]:
    if isinstance(argv, str):
        return shlex.split(argv.replace("\\\n", " "), comments=True)
    return [str(a) for a in argv]


def _parse(argv) -> dict[str, Any]:
    toks = _tokens(argv)
    out: dict[str, Any] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("--"):
            i += 1
            continue
        key, _, inline = t.partition("=")
        if inline:
            out[key] = inline
            i += 1
        elif key in _FLAGS or i + 1 >= len(toks) or toks[i + 1].startswith("--"):
            out[key] = True
            i += 1
        else:
            out[key] = toks[i + 1]
            i += 2
    return out


def _int(args: dict, key: str, default: int | None = None) -> int | None:
    v = args.get(key)
    if v is None or v is True:
        return default
    try:
        return int(float(v))
    except ValueError:
        raise MegatronArgsError(f"{key} {v!r}: a whole number. Fix: {key} 8") from None


def _vocab(args: dict, tp: int) -> int:
    if "--padded-vocab-size" in args:
        return _int(args, "--padded-vocab-size")
    vocab = _int(args, "--vocab-size")
    if vocab is None:
        tok = args.get("--tokenizer-type")
        vocab = TOKENIZER_VOCAB.get(tok) if isinstance(tok, str) else None
    if vocab is None:
        raise MegatronArgsError(f"--tokenizer-type {args.get('--tokenizer-type')!r}: the vocabulary size cannot be read "
                                f"from it (known: {', '.join(f'{k} {v:,}' for k, v in TOKENIZER_VOCAB.items())}). Fix: "
                                "add --vocab-size N (the tokenizer's) or --padded-vocab-size N")
    multiple = _int(args, "--make-vocab-size-divisible-by", 128) * tp
    return -(-vocab // multiple) * multiple


def read_megatron_args(argv) -> MegatronRun:
    """The run a Megatron / MindSpeed argument list describes (see the module docstring)."""
    import transformers

    args = _parse(argv)
    need = [k for k in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length") if k not in args]
    if need:
        raise MegatronArgsError(f"the argument list has no {', '.join(need)}: the model's shape comes from them. Fix: "
                                "pass the script's whole GPT_ARGS")
    tp = _int(args, "--tensor-model-parallel-size", 1)
    pp = _int(args, "--pipeline-model-parallel-size", 1)
    layers = _int(args, "--num-layers")
    hidden = _int(args, "--hidden-size")
    heads = _int(args, "--num-attention-heads")
    seq = _int(args, "--seq-length")
    vpp = _int(args, "--virtual-pipeline-model-parallel-size")
    per_virtual = _int(args, "--num-layers-per-virtual-pipeline-stage")
    if per_virtual:
        if layers % (pp * per_virtual):
            raise MegatronArgsError(f"--num-layers-per-virtual-pipeline-stage {per_virtual} with --num-layers {layers} "
                                    f"and --pipeline-model-parallel-size {pp}: the layers must split into pp x that. "
                                    "Fix: a divisor of layers / pp")
        vpp = layers // (pp * per_virtual)
    kv = _int(args, "--num-query-groups", heads) if args.get("--group-query-attention") else heads
    ffn = _int(args, "--ffn-hidden-size")
    llama = bool(args.get("--swiglu")) or args.get("--normalization") == "RMSNorm" or \
        args.get("--position-embedding-type") == "rope"
    vocab = _vocab(args, tp)
    experts = _int(args, "--num-experts")
    if llama:
        common = dict(hidden_size=hidden, intermediate_size=ffn or 4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                      max_position_embeddings=_int(args, "--max-position-embeddings", seq),
                      tie_word_embeddings=not args.get("--untie-embeddings-and-output-weights"),
                      attention_bias=bool(args.get("--add-qkv-bias")) or not args.get("--disable-bias-linear"),
                      rms_norm_eps=float(args.get("--norm-epsilon", 1e-5)))
        if experts:
            config = transformers.MixtralConfig(
                **common, num_local_experts=experts, num_experts_per_tok=_int(args, "--moe-router-topk", 2))
            config.intermediate_size = _int(args, "--moe-ffn-hidden-size", ffn or 4 * hidden)
        else:
            config = transformers.LlamaConfig(**common, mlp_bias=not args.get("--disable-bias-linear"))
    else:   # GPT-2 as Megatron's GPTModel without the Llama options: LayerNorm, GeLU, learned positions
        config = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_inner=ffn,
                                         n_positions=_int(args, "--max-position-embeddings", seq), vocab_size=vocab,
                                         attn_pdrop=float(args.get("--attention-dropout", 0.1)),
                                         resid_pdrop=float(args.get("--hidden-dropout", 0.1)),
                                         embd_pdrop=float(args.get("--hidden-dropout", 0.1)))
    bf16 = bool(args.get("--bf16"))
    recompute = None
    recompute_layers = None
    granularity = args.get("--recompute-granularity")
    if granularity in ("full", "selective"):
        recompute = granularity
        if granularity == "full":
            recompute_layers = _int(args, "--recompute-num-layers")
    elif granularity is not None:
        raise MegatronArgsError(f"--recompute-granularity {granularity!r}: full or selective. Fix: one of them")
    if args.get("--recompute-activations"):
        recompute = "selective"
    if args.get("--checkpoint-activations"):   # Megatron-DeepSpeed: every layer, one at a time
        recompute = "full"
    method = args.get("--recompute-method", "uniform")
    if recompute == "full" and method == "uniform" and recompute_layers:
        recompute_layers = None   # uniform: every layer recomputed, in groups of that many
    fused = [f for f in ("--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb") if args.get(f)]
    mindspeed = bool(fused or args.get("--use-mc2") or args.get("--use-flash-attn") or args.get("--use-mcore-models"))
    zero = _int(args, "--zero-stage", 0) if args.get("--deepspeed") else 0
    options: dict[str, Any] = dict(
        tp=tp, pp=pp, cp=_int(args, "--context-parallel-size", 1), ep=_int(args, "--expert-model-parallel-size", 1),
        vpp=vpp, precision="bf16" if bf16 else "fp16", amp="O2", optimizer="adamw",
        sequence_parallel=bool(args.get("--sequence-parallel")) and tp > 1,
        distributed_optimizer=bool(args.get("--use-distributed-optimizer")),
        zero=zero or None, recompute=recompute, recompute_layers=recompute_layers, recompute_method=method,
        overlap_grad_reduce=bool(args.get("--overlap-grad-reduce")) if not args.get("--deepspeed") else False,
        overlap_param_gather=bool(args.get("--overlap-param-gather")),
        flash_attention=bool(args.get("--use-flash-attn")), fuse_vector=bool(fused), mc2=bool(args.get("--use-mc2"))
        and tp > 1, stack="mindspeed" if mindspeed else "torch_npu-eager",
        fp32_grads=bf16 or bool(args.get("--accumulate-allreduce-grads-in-fp32")),
        grad_accumulation_fusion=mindspeed and not args.get("--no-gradient-accumulation-fusion"))
    options["_megatron_buckets"] = not args.get("--deepspeed")
    if args.get("--deepspeed"):
        options["bucket_mb"] = 1e9   # DeepSpeed's stage-0 engine all-reduces the gradients after the backward
    ignored = sorted(k for k in args if k in _NOT_MODELLED)
    return MegatronRun(config=config, seq_length=seq, micro_batch_size=_int(args, "--micro-batch-size", 1),
                       global_batch_size=_int(args, "--global-batch-size"), options=options, args=args,
                       ignored=ignored)


__all__ = ["MegatronArgsError", "MegatronRun", "TOKENIZER_VOCAB", "read_megatron_args"]
