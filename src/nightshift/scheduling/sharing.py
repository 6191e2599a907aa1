"""Which leading part of each prompt other prompts share, found cheaply from its bytes.

Exact token ids for every prompt would cost a tokenizer pass over the whole input. The
prefix cache only pays for what prompts share, so only that part is encoded:

1. Each prompt's text is cut into chunks of ``chunk_bytes`` bytes, and each chunk gets a
   key that covers every chunk before it (``chunk_keys``): two prompts have the same
   key at depth d exactly when their first d chunks are equal.
2. A prompt's shared depth is how many of its leading keys another prompt also has
   (``shared_depth``); its node is its key at that depth: prompts with the same node
   share that many chunks and differ in the next one.
3. The exact shared length of a node's prompts is those chunks plus the common start of
   their next chunks (the longest common prefix of the smallest and the largest of
   them); one prompt's pieces are cut there (``cut_pieces``), at a whitespace boundary
   so the cut piece encodes to the very ids the whole prompt has, and encoded once.
4. Its token ids, in whole KV blocks, give the node's block keys (``block_keys``), which
   the prefix order works on (``scheduling.order``).

A shared run of fewer bytes than one chunk inside a group is not seen; a chunk is at
least one KV block of tokens wide only where a token takes a byte or more (always, for
record text). Pure: arrays in, arrays out. No I/O.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from nightshift.scheduling.chunkkeys import ChunkKeys

MIN_CHUNK_BYTES = 64
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TRAILING_SPACE = re.compile(r"\s+\S*\Z")
_WORD_END = re.compile(r"(?<=\S)\s")


def chunk_bytes(block_size: int) -> int:
    """Chunk width in bytes: one KV block of one-byte tokens, at least MIN_CHUNK_BYTES
    (finer chunks cost more keys than the cache could ever gain from them)."""
    return max(MIN_CHUNK_BYTES, block_size)


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the whole key."""
    with np.errstate(over="ignore"):
        z = values.copy()
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _offsets(texts: pl.Series) -> tuple[pa.Array, np.ndarray]:
    array = texts.cast(pl.Binary).rechunk().to_arrow()
    array = array.cast(pa.large_binary()) if array.type != pa.large_binary() else array
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)
    return array, offsets[array.offset : array.offset + len(array) + 1]


def _places(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For lists of ``counts`` items laid end to end: where each list starts, and each
    item's place in its own list."""
    firsts = np.cumsum(counts) - counts
    return firsts, np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(firsts, counts)


def chunk_keys(texts: pl.Series, size: int) -> pl.Series:
    """Per text, one key per chunk of ``size`` bytes (the last may be shorter); the key
    at depth d covers chunks 1..d, so equal keys mean equal leading bytes."""
    array, offsets = _offsets(texts)
    lengths = np.diff(offsets)
    counts = -(-lengths // size)
    total = int(counts.sum())
    firsts, local = _places(counts)
    starts = np.repeat(offsets[:-1], counts) + local * size
    ends = np.minimum(starts + size, np.repeat(offsets[1:], counts))
    bounds = np.append(starts, ends[-1] if total else offsets[0]).astype(np.int64)
    chunks = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), total, [None, pa.py_buffer(bounds), array.buffers()[2]]
    )
    hashed = pl.Series(chunks).hash(seed=11).to_numpy()
    with np.errstate(over="ignore"):
        mixed = _mix(hashed ^ (local.astype(np.uint64) * _GOLDEN))
        running = np.cumsum(mixed, dtype=np.uint64)  # wraps modulo 2**64, as meant
        ahead = running[np.maximum(firsts - 1, 0)] if total else np.zeros_like(firsts)
        before = np.where(firsts > 0, ahead, np.uint64(0))  # every text empty: no key
        keys = running - np.repeat(before.astype(np.uint64), counts)
    list_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lists = pa.LargeListArray.from_arrays(pa.array(list_offsets), pa.array(keys))
    return pl.Series(texts.name, lists)


AT_ONCE_KEYS = 1 << 20  # keys looked at together: a window of levels, or the rest at once
WINDOW_PASSES = 4  # windows read from the key file before the keys left are read at once


def shared_depth(chunks: pl.Series) -> pl.DataFrame:
    """``depth_of`` for prompts' ``chunk_keys`` held in memory, in their order."""
    with ChunkKeys.of(chunks) as keys:
        return depth_of(keys, np.arange(len(chunks), dtype=np.int64))


def depth_of(keys: ChunkKeys, records: np.ndarray) -> pl.DataFrame:
    """Per record of ``records`` (numbers in ``keys``, in the order wanted): ``depth``, how
    many leading chunks another of them also starts with, and ``node``, its key at that
    depth (null at depth 0).

    A key covers every chunk before it (and its place), so only a prompt whose first k
    keys are all shared can share key k, and only with another such prompt. So levels
    are looked at in order, and only for the prompts still sharing, a window of levels
    at a time read back from ``keys`` (``AT_ONCE_KEYS`` keys a window): all 13 keys of a
    million short tickets were 100 MB. Once the prompts still sharing have no more keys
    left than a window holds, they are looked at together (``the_rest``): a few prompts
    sharing a long document go thousands of levels deep, and a level is a polars call."""
    order = np.argsort(records, kind="stable")  # keys are read back in record order
    numbers, found = records[order], _Found.none(len(records))
    counts = keys.counts()[numbers].astype(np.int64)
    sharing, level, passes = np.flatnonzero(counts > 0), 0, 0
    while len(sharing) > 1:
        left = counts[sharing] - level
        whole = int(left.sum()) <= AT_ONCE_KEYS
        # a window four times as many keys: a level is cheap on its own, but each window
        # reads the file again (a million tickets share their first four levels). Many
        # prompts still sharing after WINDOW_PASSES windows (one long document under
        # every question) take their keys left at once: windows would read it for ever.
        width = max(1, 4 * AT_ONCE_KEYS // len(sharing))
        width = None if whole or passes >= WINDOW_PASSES else width
        window = _Keys.of(*keys.gather(numbers[sharing], level, width), left)
        if whole:
            window.the_rest(np.arange(len(sharing)), 0)
            found.update(sharing, level, window)
            break
        kept, steps = window.levels(width or int(left.max()))
        found.update(sharing, level, window)
        sharing, level, passes = sharing[kept], level + steps, passes + 1
    return found.frame(order)


class _Found(NamedTuple):
    depth: np.ndarray
    node: np.ndarray

    @classmethod
    def none(cls, size: int) -> _Found:
        return cls(np.zeros(size, dtype=np.uint32), np.zeros(size, dtype=np.uint64))

    def update(self, sharing: np.ndarray, level: int, window: _Keys) -> None:
        """What ``window`` (the levels from ``level`` on of ``sharing``) found deeper."""
        deeper = window.depth > 0
        self.depth[sharing[deeper]] = level + window.depth[deeper]
        self.node[sharing[deeper]] = window.node[deeper]

    def frame(self, order: np.ndarray) -> pl.DataFrame:
        """In the records' own order (they were worked on sorted: ``order``)."""
        depth, node = np.empty_like(self.depth), np.empty_like(self.node)
        depth[order], node[order] = self.depth, self.node
        return pl.DataFrame(
            {
                "depth": depth,
                "node": pl.Series(node, dtype=pl.UInt64).set(pl.Series(depth == 0), None),
            }
        )


class _Keys(NamedTuple):
    """Prompts' chunk keys from some level on (flat ``values``, each prompt's ``offsets``
    into them and its ``counts`` of keys left, which may run past the keys held), and the
    ``depth`` and ``node`` found so far, from that level."""

    offsets: np.ndarray
    values: np.ndarray
    counts: np.ndarray
    depth: np.ndarray
    node: np.ndarray

    @classmethod
    def of(cls, held: np.ndarray, values: np.ndarray, counts: np.ndarray) -> _Keys:
        size = len(held)
        offsets = np.cumsum(held) - held
        found = _Found.none(size)
        return cls(offsets, values, counts.astype(np.int64), found.depth, found.node)

    def levels(self, width: int) -> tuple[np.ndarray, int]:
        """Level after level, while two prompts or more still share and keys are held:
        the prompts still sharing after them, and how many levels were looked at."""
        sharing, level = np.arange(len(self.counts)), 0
        while len(sharing) > 1 and level < width:
            sharing = self.one_level(sharing, level)
            level += 1
        return sharing, level

    def one_level(self, sharing: np.ndarray, level: int) -> np.ndarray:
        """Which of ``sharing`` (prompts whose first ``level`` keys are all shared) share
        key ``level`` too, and have another after it."""
        at = self.values[self.offsets[sharing] + level]
        if (at == at[0]).all():  # a common start: every prompt still shares
            kept = sharing
        else:
            kept = sharing[pl.Series(at).is_duplicated().to_numpy()]
            at = self.values[self.offsets[kept] + level]
        self.depth[kept], self.node[kept] = level + 1, at
        return kept[self.counts[kept] > level + 1]

    def the_rest(self, sharing: np.ndarray, level: int) -> None:
        """Depth and node of ``sharing`` from key ``level`` on, over all their keys left
        at once: a prompt's depth is where its first key no other prompt has stands."""
        left = self.counts[sharing] - level  # one key or more each
        firsts, local = _places(left)
        at = self.values[np.repeat(self.offsets[sharing] + level, left) + local]
        repeated = pl.Series(at).is_duplicated().to_numpy()
        shared = np.minimum.reduceat(np.where(repeated, np.repeat(left, left), local), firsts)
        deeper = shared > 0
        self.depth[sharing[deeper]] = level + shared[deeper]
        self.node[sharing[deeper]] = at[firsts[deeper] + shared[deeper] - 1]


def common_length(lowest: bytes, highest: bytes) -> int:
    """Bytes that every string between ``lowest`` and ``highest`` (in byte order) starts
    with: the common prefix of the two ends."""
    return len(os.path.commonprefix([lowest, highest]))


def cut_pieces(pieces: list[str], length: int) -> list[str]:
    """The leading ``length`` bytes of a prompt's pieces (``[t0, x1, t1, ..., tn]``, see
    ``PromptEncoder.encode_pieces``) as pieces that encode to exactly the ids the whole
    prompt starts with: a frame piece is kept whole or dropped, and a cut record text
    ends before its last whitespace (a word the cut splits would be encoded otherwise).
    Ends with an empty frame piece, so it is itself a prompt's pieces."""
    seen = 0
    for k, piece in enumerate(pieces):
        raw = piece.encode()
        if seen + len(raw) <= length:
            seen += len(raw)
            continue
        if k % 2 == 0:  # inside a frame piece
            return [*pieces[:k], ""] if k else [""]
        return [*pieces[:k], _whole_words(raw, length - seen), ""]
    return list(pieces)


def _whole_words(raw: bytes, cut: int) -> str:
    """``raw[:cut]`` as text, ending where a word ends and whitespace follows (a
    boundary tokenizers never merge across), or empty where it has none."""
    part = raw[:cut].decode(errors="ignore")
    if len(part.encode()) == cut and raw[cut : cut + 1].isspace() and part[-1:].strip():
        return part
    return part[: match.start()] if (match := _TRAILING_SPACE.search(part)) else ""


def block_keys(ids: list[int], block_size: int) -> list[int]:
    """A key per whole KV block of ``ids``, covering every block before it (as vLLM's
    block hashes do): equal keys at depth k mean equal first k blocks of ids. (Python
    hashes tuples of ints the same in every process: no hash seed applies to them.)"""
    keys, previous = [], 0
    for k in range(len(ids) // block_size):
        previous = hash((previous, tuple(ids[k * block_size : (k + 1) * block_size])))
        keys.append(previous & 0xFFFFFFFFFFFFFFFF)
    return keys


def word_pieces(pieces: list[str], every: int = 256) -> list[str]:
    """``pieces`` with each long record text split where whitespace follows a word, about
    every ``every`` characters: for a tokenizer whose pieces compose, the ids are the
    same, and prompts that share a long start (one document under many nodes) share
    those sub-pieces, which the encoder's cache then encodes once."""
    out = [pieces[0]]
    for k in range(1, len(pieces) - 1, 2):
        text, start = pieces[k], 0
        while len(text) - start > 2 * every:
            found = _WORD_END.search(text, start + every)
            if not found:
                break
            out += [text[start : found.start()], ""]
            start = found.start()
        out += [text[start:], pieces[k + 1]]
    return out
