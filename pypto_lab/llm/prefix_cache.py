"""Automatic prefix caching for the serving simulator: KV blocks of a prompt prefix that several
requests share are computed once, held once, and found again by later requests, as vLLM's
automatic prefix caching does (vLLM V1 ``KVCacheManager``; on by default since V1).

What vLLM does (docs/design/prefix_caching.md of vllm-project/vllm): a *full* KV block is named by
the hash of its tokens and of the blocks before it, so two requests whose prompts begin with the
same tokens name their first blocks alike. At admission the scheduler looks up the longest run of
cached blocks at the head of the prompt, takes a reference on each (ref-counted: a block is held
once however many requests use it) and prefills only the rest: a chunk of the uncached tokens
attending over the cached ones. When all prompt tokens hit, the last one is computed anyway (its
logits give the first output token), so a hit is at most ``(tokens - 1) // block_size`` blocks.
Blocks are registered as cached when the scheduler hands them out for computation, so a request
admitted in the same step already finds a block its predecessor is computing. A block whose
references all went away stays cached but free; it is evicted, least recently used first, only
when a new block is needed and no other free block is left.

What the simulator knows of a prompt is not its tokens but a *prefix group*: requests of one group
share their first ``prefix_tokens`` tokens (a system prompt, a few-shot header, a conversation's
history). Block ``j`` of a group is the same block for every request of the group whose prefix
covers it, so a group's cached blocks are always a head ``[0, cached)`` of its chain, and their
reference counts fall along it (a request holding block ``j`` holds every block before it).

`PrefixCache` keeps that state beside the scheduler's block count: the scheduler's ``free`` counts
every block nobody references (cached ones included); `settle` evicts cached free blocks, tail of
the least recently used group first, until the uncached free blocks suffice. Blocks a request
computes beyond its group's prefix, and the copies it computes of prefix blocks another request
registered first, are its own, as before. Not modelled: a preempted request finding its own
non-prefix blocks again (only its group's prefix is found again), and hash collisions.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


class PrefixCache:
    """The shared-prefix KV blocks of one serving run (see the module's docstring).

    ``group[i]`` is request ``i``'s prefix group (-1: none), ``prefix_tokens[i]`` how many of its
    first tokens the group shares; ``enabled=False`` shares nothing (every lookup misses: the run
    without caching, whose statistics then show the tokens asked for and a hit rate of 0)."""

    def __init__(self, group: np.ndarray, prefix_tokens: np.ndarray, block_size: int, enabled: bool = True):
        self.enabled = enabled
        self.bs = int(block_size)
        self.group = group
        self.blocks = np.where(group >= 0, prefix_tokens // self.bs, 0).astype(np.int64)  # shareable full blocks
        n_groups = int(group.max()) + 1 if group.size else 0
        longest = np.zeros(n_groups, np.int64)
        if n_groups:
            np.maximum.at(longest, group[group >= 0], self.blocks[group >= 0])
        self.refs = [np.zeros(int(m), np.int64) for m in longest]  # per group, per block: references
        self.cached = np.zeros(n_groups, np.int64)                  # per group: blocks [0, cached) cached
        self.idle = np.zeros(n_groups, np.int64)                    # per group: cached blocks nobody holds
        self.held = np.zeros(group.size, np.int64)                  # per request: leading shared blocks held
        self.evictable = 0                                          # cached blocks nobody holds, all groups
        self.lru: OrderedDict[int, None] = OrderedDict()            # groups with idle blocks, oldest first
        self.query_tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.peak_shared = 0

    # --- admission ------------------------------------------------------------------------------

    def lookup(self, i: int, tokens: int) -> tuple[int, int]:
        """(cached blocks request ``i`` would find for a prefill of ``tokens`` tokens, how many of
        them nobody holds now and so leave the free pool when it takes them). Changes nothing."""
        g = int(self.group[i])
        if g < 0 or not self.enabled:
            return 0, 0
        h = min(int(self.blocks[i]), (tokens - 1) // self.bs, int(self.cached[g]))
        if h <= 0:
            return 0, 0
        refs = self.refs[g]
        return h, int(np.count_nonzero(refs[:h] == 0))

    def admit(self, i: int, tokens: int, hit: int) -> None:
        """Request ``i`` takes the ``hit`` blocks `lookup` found; counts the tokens asked and found."""
        g = int(self.group[i])
        if g >= 0:
            self.query_tokens += tokens
            self.hit_tokens += hit * self.bs
        if hit <= 0:
            return
        refs = self.refs[g]
        woken = int(np.count_nonzero(refs[:hit] == 0))
        refs[:hit] += 1
        self.held[i] = hit
        if woken:
            self.idle[g] -= woken
            self.evictable -= woken
        self._touch(g)

    def computing(self, i: int, upto: int) -> None:
        """Request ``i``'s cache will hold ``upto`` tokens after this step: the prefix blocks it
        fills become cached (held by it) if they extend its group's chain; a block another request
        cached first stays ``i``'s own copy."""
        g = int(self.group[i])
        if g < 0 or not self.enabled:
            return
        k = min(int(self.blocks[i]), upto // self.bs)
        h = int(self.held[i])
        if k <= h or int(self.cached[g]) != h:
            return
        self.refs[g][h:k] = 1
        self.cached[g] = k
        self.held[i] = k
        self.peak_shared = max(self.peak_shared, int(self.cached.sum()))

    # --- leaving --------------------------------------------------------------------------------

    def release(self, i: int) -> int:
        """Request ``i`` leaves (finished, preempted or cancelled) and drops its references. The
        scheduler returns every block the request held to ``free``; this is the correction to add:
        the shared blocks others still hold stay in use."""
        h = int(self.held[i])
        if h == 0:
            return 0
        g = int(self.group[i])
        refs = self.refs[g]
        refs[:h] -= 1
        zero = int(np.count_nonzero(refs[:h] == 0))
        self.held[i] = 0
        if zero:
            self.idle[g] += zero
            self.evictable += zero
        self._touch(g)
        return zero - h

    def settle(self, free: int) -> None:
        """Evict cached blocks nobody holds until the uncached free blocks are not negative
        (``free`` counts both kinds): least recently used group first, from the tail of its chain."""
        while self.evictable > free:
            g = next(iter(self.lru))
            self.cached[g] -= 1
            self.idle[g] -= 1
            self.evictable -= 1
            self.evictions += 1
            if self.idle[g] == 0:
                del self.lru[g]

    def _touch(self, g: int) -> None:
        if self.idle[g]:
            self.lru[g] = None
            self.lru.move_to_end(g)
        else:
            self.lru.pop(g, None)

    # --- checks and figures ---------------------------------------------------------------------

    def in_use(self) -> int:
        """Cached blocks some request holds (each counted once)."""
        return int(self.cached.sum() - self.idle.sum())

    def audit(self, held_by_running: int) -> None:
        """The cache's own invariants: chains are heads with falling reference counts, the idle and
        evictable counts match them, and the running requests hold what the counts say."""
        total = 0
        for g, refs in enumerate(self.refs):
            c = int(self.cached[g])
            if np.any(refs[c:] != 0) or np.any(np.diff(refs[:c]) > 0) or np.any(refs[:c] < 0):
                raise AssertionError(f"prefix group {g}: references {refs[:c + 1].tolist()} are not a falling head")
            if int(np.count_nonzero(refs[:c] == 0)) != int(self.idle[g]):
                raise AssertionError(f"prefix group {g}: idle count {self.idle[g]} is wrong")
            total += int(refs[:c].sum())
        if int(self.idle.sum()) != self.evictable or total != held_by_running:
            raise AssertionError(f"prefix cache: {self.evictable} evictable / {total} references held, "
                                 f"{held_by_running} by running requests")

    def stats(self) -> dict:
        return {
            "enabled": self.enabled,
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "hit_tokens": int(self.hit_tokens),
            "query_tokens": int(self.query_tokens),
            "groups": int(self.cached.size),
            "peak_cached_blocks": int(self.peak_shared),
            "evictions": int(self.evictions),
        }


__all__ = ["PrefixCache"]
