"""The fake engine's prefix cache: how many tokens of a prompt come from cache, as whole
leading blocks seen before (never the last token), as vLLM's prefix cache serves them.
A block's key chains its tokens onto the key of the blocks before it, as vLLM's block
hashes do (these keys never leave the process). Two kinds, one for each of the fake
engine's paths (``engines.fake``):

- ``LruBlocks`` (the default path): one hash a block, and the least recently used blocks
  evicted beyond ``cache_blocks``.
- ``FastBlocks`` (the fast path, ``engines.fake_fast``): the keys made in C-level calls
  (``zip`` cuts the blocks, ``hash`` each, a running sum of them times fixed odd weights
  chains each key to every block before it), looked up in two sets: the blocks touched
  lately, and those touched in the span before (once the first holds half of
  ``cache_blocks``, it becomes the second; 0 caches nothing). Unbounded, its hits are
  ``LruBlocks``' exactly. Bounded, it holds at most ``cache_blocks`` keys and two prompts'
  blocks more, and forgets sooner than a least-recently-used cache: a block survives
  between half and all of ``cache_blocks`` later touches, so a working set over half the
  cache is partly lost (a job's hot shared prefixes are not).
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import accumulate, islice, takewhile
from operator import add, mul

_WEIGHTS: list[int] = []  # the blocks' weights, odd, the same in every engine and process
_DRAW_WEIGHT = random.Random(16).getrandbits
_GROWING = threading.Lock()  # engines in two threads draw the weights in one order


class LruBlocks:
    def __init__(self, block_size: int, cache_blocks: int | None) -> None:
        self._size, self._keep = block_size, cache_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached(self, ids: Sequence[int]) -> int:
        """Tokens of ``ids`` served from cache; its blocks are the most recent now."""
        size = self._size
        cached, hit, key = 0, True, 0
        for end in range(size, len(ids), size):
            key = hash((key, *ids[end - size : end]))
            if hit and key in self._blocks:
                cached = end
            else:
                hit = False
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while self._keep is not None and len(self._blocks) > self._keep:
            self._blocks.popitem(last=False)
        return cached

    def clear(self) -> None:
        self._blocks.clear()


class FastBlocks:
    def __init__(self, block_size: int, cache_blocks: int | None) -> None:
        self._size = block_size
        self._recent: set[int] = set()
        self._before: set[int] = set()
        self._caches = cache_blocks != 0
        self._half = max(1, cache_blocks // 2) if cache_blocks else None

    def __len__(self) -> int:
        return len(self._recent) + len(self._before)

    def cached(self, ids: Sequence[int]) -> int:
        """Tokens of ``ids`` served from cache; its blocks are the most recent now."""
        size = self._size
        full = max(0, (len(ids) - 1) // size)
        if not (full and self._caches):
            return 0
        if len(_WEIGHTS) < full:
            with _GROWING:
                _WEIGHTS.extend(_DRAW_WEIGHT(64) | 1 for _ in range(full - len(_WEIGHTS)))
        blocks = islice(zip(*[iter(ids)] * size, strict=False), full)
        keys = list(accumulate(map(mul, map(hash, blocks), _WEIGHTS), add))
        recent, before = self._recent, self._before
        hits = len(list(takewhile(recent.__contains__, keys)))
        if before:
            for key in islice(keys, hits, None):
                if key not in recent and key not in before:
                    break
                hits += 1
        recent.update(keys)
        if self._half is not None and len(recent) >= self._half:
            self._before, self._recent = recent, set()
        return hits * size

    def clear(self) -> None:
        self._recent.clear()
        self._before.clear()
