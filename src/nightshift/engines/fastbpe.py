"""Record text through tiktoken when the model's tokenizer is a byte-level BPE it repeats.

Encoding each record's text is the run path's largest cost per record (the engine gets
token ids, so nightshift encodes every prompt once: ``benchmarks/run_path.py``). For a
byte-level BPE tokenizer (GPT-2, SmolLM, Qwen) tiktoken runs the same algorithm
about 4x faster on one core and releases the GIL while it does. It is used only where
the tokenizer's own description (its ``tokenizer.json``) says it is that algorithm, and
only after it gave the tokenizer's very ids on a fixed set of hard strings (scripts,
digits, whitespace runs, contractions, special-token lookalikes); anything else keeps
the tokenizer itself. The choice depends on the tokenizer alone, so a plan and its runs
always encode alike. ``NIGHTSHIFT_TOKENIZER=hf`` keeps the tokenizer itself always.
"""

from __future__ import annotations

import json
import os
import random
import re
import unicodedata
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

import polars as pl

EncodeMany = Callable[[list[str]], list[list[int]]]
Encoded = list[list[int] | None]  # None: a text tiktoken cannot take (``_without_token``)

# GPT-2's split, which ``ByteLevel(use_regex=True)`` applies before the merges
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same without its lookahead, which costs half of tiktoken's time on prose. Its one
# effect: a run of two or more spaces before a non-space is split before its last
# space (which then starts the next piece, `` word``). ``_TextBatch`` makes that cut
# first, so the rest splits alike.
GPT2_SPLIT_NO_LOOKAHEAD = GPT2_SPLIT.replace(r"\s+(?!\S)|", "")
# Unicode White_Space: what ``\s`` is in Rust's regex (tiktoken's split, and polars)
WHITE = "\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
RUN_CUT = re.compile(f"(?<=[{WHITE}])(?=[{WHITE}][^{WHITE}])")  # before a run's last space
CUT = "\x00"  # where polars marks a cut (a text holding one is cut by RUN_CUT instead)


def fast_encoder(hf_tokenizer: Any, reference: EncodeMany) -> EncodeMany | None:
    """tiktoken's encoder for ``hf_tokenizer`` (record text as plain text: special-token
    strings split), or None where it is not the same algorithm or, on the check strings,
    does not give ``reference``'s ids."""
    if os.environ.get("NIGHTSHIFT_TOKENIZER", "").lower() == "hf":
        return None
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        encode = _encoder(json.loads(backend.to_str()))
    except (ImportError, ValueError, KeyError, TypeError):  # not a shape tiktoken takes
        return None
    if encode is None:
        return None

    def encode_many(texts: list[str]) -> list[list[int]]:
        out = encode(texts)
        others = [k for k, ids in enumerate(out) if ids is None]
        if others:  # a byte with no token of its own: the tokenizer's own way
            for k, ids in zip(others, reference([texts[k] for k in others]), strict=True):
                out[k] = ids
        return out  # type: ignore[return-value]  # every None replaced

    texts = check_texts()
    try:
        agrees = encode_many(texts) == reference(texts)
    except BaseException:  # noqa: BLE001 - a tiktoken panic is a BaseException
        return None
    return encode_many if agrees else None


def _encoder(described: dict[str, Any]) -> Callable[[list[str]], Encoded] | None:
    model = described.get("model") or {}
    split = _split_pattern(described.get("pre_tokenizer"))
    normalize = _normalizer(described.get("normalizer"))
    if model.get("type") != "BPE" or split is None or normalize is False:
        return None
    if model.get("dropout") or model.get("byte_fallback"):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    added = described.get("added_tokens") or []
    if any(not t.get("special") for t in added):  # matched whole even in record text
        return None
    ranks = _ranks(model, {t["id"] for t in added})
    if ranks is None:
        return None
    spans = _without_token(ranks)
    if spans is False:
        return None
    import tiktoken

    cut = split == GPT2_SPLIT  # split without the lookahead, runs cut first
    encoding = tiktoken.Encoding(
        "nightshift-bpe",
        pat_str=GPT2_SPLIT_NO_LOOKAHEAD if cut else split,
        mergeable_ranks=ranks,
        special_tokens={},
    )
    return partial(_TextBatch(normalize, spans, cut).encode, encoding.encode_ordinary)


class _TextBatch:
    """A batch of record texts made ready for tiktoken with vectorized (polars) steps: NFC
    where the tokenizer normalizes, texts tiktoken cannot take found, whitespace runs cut
    where ``GPT2_SPLIT``'s lookahead would split them."""

    def __init__(self, normalize: bool | None, spans: list[tuple[int, int]] | None, cut: bool):
        self.normalize, self.cut = normalize, cut
        # the characters tiktoken cannot take: those of ASCII (a memchr each), and all
        self.unusual_ascii = [chr(c) for a, z in spans or [] for c in range(a, min(z, 127) + 1)]
        self.unusual = spans and re.compile(
            "[" + "".join(f"\\U{a:08x}-\\U{z:08x}" for a, z in spans) + "]"
        )

    def encode(self, plain: Callable[[str], list[int]], texts: list[str]) -> Encoded:
        if self.normalize:
            texts = [t if t.isascii() else unicodedata.normalize("NFC", t) for t in texts]
        try:
            column = pl.Series(texts, dtype=pl.String)
        except UnicodeEncodeError:  # a lone surrogate (from JSON): no Arrow string
            return [self._one(plain, text) for text in texts]
        marked = column.str.replace_all(r"(\s)(\s\S)", f"${{1}}{CUT}${{2}}") if self.cut else column
        out: Encoded = []
        for k, text in enumerate(marked.to_list()):
            if self.unusual and self._unusual(texts[k]):
                out.append(None)  # a byte with no token of its own: the tokenizer's own way
            elif not self.cut or CUT not in text:
                out.append(plain(text))
            elif CUT in texts[k]:  # its own NUL: polars' marks cannot be told apart
                out.append(self._one(plain, texts[k]))
            else:
                out.append([i for part in text.split(CUT) for i in plain(part)])
        return out

    def _unusual(self, text: str) -> bool:
        if text.isascii():
            return any(c in text for c in self.unusual_ascii)
        return self.unusual.search(text) is not None  # type: ignore[union-attr]

    def _one(self, plain: Callable[[str], list[int]], text: str) -> list[int] | None:
        if self.unusual and self._unusual(text):
            return None
        parts = RUN_CUT.split(text) if self.cut else [text]
        return [i for part in parts for i in plain(part)]


def _without_token(ranks: dict[bytes, int]) -> list[tuple[int, int]] | None | bool:
    """The code point ranges of characters with a UTF-8 byte that is no token on its own
    (the tokenizer drops such a byte, tiktoken cannot): None when there are none, False
    when too many to list (a missing continuation byte)."""
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if not missing:
        return None
    if any(0x80 <= b <= 0xBF for b in missing):
        return False
    spans = []  # code points by the byte they start with (UTF-8's lead byte ranges)
    for b in missing:
        if b < 0x80:
            spans.append((b, b))
        elif 0xC2 <= b <= 0xDF:
            spans.append(((b - 0xC0) << 6, ((b - 0xC0) << 6) + 0x3F))
        elif 0xE0 <= b <= 0xEF:  # E0 starts U+0800 at the lowest
            spans.append((max((b - 0xE0) << 12, 0x800), ((b - 0xE0) << 12) + 0xFFF))
        elif 0xF0 <= b <= 0xF4:  # F0 starts U+10000 at the lowest
            first = max((b - 0xF0) << 18, 0x10000)
            spans.append((first, min(((b - 0xF0) << 18) + 0x3FFFF, 0x10FFFF)))
    if not spans:  # only bytes valid UTF-8 never holds (C0, C1, F5-FF)
        return None
    return spans


def _split_pattern(pre: dict[str, Any] | None) -> str | None:
    """The regex that splits text before the merges, when the pre-tokenizer is one."""
    if not pre:
        return None
    if pre.get("type") == "ByteLevel":
        plain = pre.get("use_regex", True) and not pre.get("add_prefix_space")
        return GPT2_SPLIT if plain else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, level = steps
    if level.get("type") != "ByteLevel" or level.get("use_regex") or level.get("add_prefix_space"):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    plain = split.get("type") == "Split" and not split.get("invert")
    return pattern if plain and split.get("behavior") == "Isolated" else None


def _normalizer(normalizer: dict[str, Any] | None) -> bool | None:
    """None: no normalizer; True: NFC; False: one tiktoken cannot repeat."""
    if not normalizer:
        return None
    return normalizer.get("type") == "NFC"


def _ranks(model: dict[str, Any], added: set[int]) -> dict[bytes, int] | None:
    """The vocabulary as bytes -> id, when ids grow with the merges (tiktoken merges the
    pair whose joint token has the lowest id; the tokenizer, the earliest merge) and every
    token of two bytes or more is some merge's joint (tiktoken forms any token from two
    adjacent parts; the tokenizer only through a listed merge: Llama 3 has tokens no merge
    makes, and keeps its tokenizer)."""
    decoder = _byte_decoder()
    ranks: dict[bytes, int] = {}
    for token, rank in model.get("vocab", {}).items():
        if rank in added:
            continue
        if any(c not in decoder for c in token):
            return None
        ranks[bytes(decoder[c] for c in token)] = rank
    if len(ranks) != len(set(ranks.values())):
        return None
    previous, joints = -1, 0
    for merge in model.get("merges", []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        joint = ranks.get(bytes(decoder[c] for c in left + right))
        if joint is None or joint <= previous:
            return None
        previous, joints = joint, joints + 1
    longer = sum(1 for token in ranks if len(token) > 1)
    return ranks if joints == longer else None  # merges make distinct tokens (ids grow)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte, reversed."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {v: k for k, v in bytes_to_unicode().items()}


@lru_cache(maxsize=1)
def check_texts() -> list[str]:
    """Hard strings both encoders must agree on, the same every time."""
    fixed = [
        "Subject: Refund for order #4521\n\nI was charged twice. Can't log in!!",
        "It's, I'M, you're, THEY'LL, we'd, she's, 's 't 'RE",
        "1 12 123 1234 12345 1234567890 3.14159 -42 1,000,000 0x1F ½ ٣ ৩",
        "  two  spaces\tand\ttabs\r\nCRLF\n\n\nthree newlines   trailing   ",
        "\u00a0nbsp\u3000ideographic\u2003em\u200bzero-width",
        "<|im_end|> <|im_start|>system </s><s> <|endoftext|> [INST] <think>",
        "日本語のテキスト、中文文本。한국어 텍스트 العربية עברית Русский Ελληνικά हिन्दी",
        "emoji 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ combining e\u0301 a\u0308 cafe\u0301 Å Å",
        'def f(x):\n    return {"a": [1, 2]}  # code\n\n\tif x != None: pass',
        "https://example.com/path?q=1&r=two#frag user@example.com C:\\Users\\x",
        "!!!???...---___***///   ))) ((( [[[ ]]] ''' \"\"\" ``` ~~~",
        "control \x00\x01\x04\x06\x13\x1b\x7f bytes",
        "far planes \U00020000 \U00040001 \U00080001 \U000e0001 \U00100001 end",
        "",
        " ",
        "\n",
    ]
    pick = random.Random(40)
    alphabet = "aZ9 \n\t'.,!?-_éßøçñ日本語中文한국Жжαβγ😀👍🏽\u0301\u00a0\u200b<>|/\\\"#$%&"
    extra = ["".join(pick.choice(alphabet) for _ in range(pick.randint(1, 60))) for _ in range(200)]
    return fixed + extra
