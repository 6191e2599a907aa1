"""Record text through tiktoken (``engines.fastbpe``): the tokenizer's very ids, or the
tokenizer itself wherever tiktoken would not be the same algorithm."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from nightshift.engines.fastbpe import check_texts
from nightshift.engines.tokenizer import PromptEncoder

# Llama 3's split regex (a Split step before a ByteLevel without its own regex)
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "Refund for order 4521: I was charged twice and can't log in.",
    "The app crashes when I open settings; please add dark mode!",
    "Café crème, naïve résumé; 日本語のテキスト and 中文文本; Здравствуйте, мир.",
    "def f(x):\n    return x + 1  # code\n\n\tprint(f(41))",
] * 50


def trained(pre, normalizer=None, specials=("<s>", "</s>"), added=()) -> PreTrainedTokenizerFast:
    """A small byte-level BPE trained here with the pre-tokenizer ``pre``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=list(specials),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if added:
        hf.add_tokens(list(added))  # plain added tokens: matched whole in any text
    return hf


# Every Unicode White_Space character (Rust regex's \s, which tiktoken splits on), and
# characters Python or older Unicode call space that it does not
WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
WHITE_SPACE += "\u2028\u2029\u202f\u205f\u3000"
NEAR_SPACE = "\x1c\x1d\x1e\x1f\u180e\u200b\ufeff\x00"


def hard_texts() -> list[str]:
    """Texts beyond the check set: tickets, whitespace, scripts, specials, far planes;
    runs of every kind of space before words, digits, marks and the end (where GPT-2's
    split cuts a run before its last space)."""
    pick = random.Random(7)
    alphabet = "ab Z9\n\r\t'.!-é日Ж😀\u0301\u00a0<>|/ "
    made = ["".join(pick.choice(alphabet) for _ in range(pick.randint(0, 80))) for _ in range(300)]
    spaces = WHITE_SPACE + NEAR_SPACE + "   \n\n"
    words = ["a", "Zz", "9", "12", "'s", "'t", ".", "!?", "é", "日", "😀", ""]
    runs = [
        "".join(
            pick.choice(words) + "".join(pick.choice(spaces) for _ in range(pick.randint(0, 4)))
            for _ in range(pick.randint(1, 12))
        )
        for _ in range(600)
    ]
    held_nul = ["\x00" + run for run in runs[:300]]  # cut without polars' marker
    return [*CORPUS[:4], "<s> </s> <|im_end|>", "x\x04y\U00040001z", *made, *runs, *held_nul]


def assert_same_ids(encoder: PromptEncoder) -> None:
    texts = hard_texts() + check_texts()
    assert encoder.encode_texts(texts) == encoder._hf_texts(texts)


@pytest.mark.parametrize(
    "build",
    [
        lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=False)),  # GPT-2, SmolLM
        lambda: trained(  # a Split regex before ByteLevel (Llama 3's shape)
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        ),
        lambda: trained(  # Qwen 2: NFC first
            pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            ),
            normalizer=normalizers.NFC(),
        ),
    ],
    ids=["gpt2", "split-regex", "split-regex-nfc"],
)
def test_byte_level_bpe_goes_through_tiktoken_with_the_tokenizers_own_ids(build):
    encoder = PromptEncoder(build())
    assert encoder.fast
    assert_same_ids(encoder)


def test_a_byte_without_a_token_of_its_own_is_encoded_by_the_tokenizer():
    """A vocabulary without every byte (SmolLM2 lacks \\x04): such text takes the
    tokenizer's own way (it drops the byte; tiktoken would fail), the rest stays fast."""
    hf = trained(pre_tokenizers.ByteLevel(add_prefix_space=False))
    backend = hf.backend_tokenizer
    vocab = backend.get_vocab()
    missing = pre_tokenizers.ByteLevel.alphabet()
    byte = next(c for c in sorted(missing) if ord(c) > 255)  # a control byte's stand-in
    assert byte in vocab
    described = json.loads(backend.to_str())
    del described["model"]["vocab"][byte]
    merges = described["model"]["merges"]
    described["model"]["merges"] = [m for m in merges if byte not in "".join(m)]
    smaller = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(described)), bos_token="<s>"
    )
    encoder = PromptEncoder(smaller)
    assert encoder.fast
    assert_same_ids(encoder)


@pytest.mark.parametrize(
    "build",
    [
        lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=False), added=("<think>",)),
        lambda: trained(pre_tokenizers.ByteLevel(add_prefix_space=True)),
        lambda: trained(pre_tokenizers.Whitespace()),
        lambda: trained(
            pre_tokenizers.ByteLevel(add_prefix_space=False), normalizer=normalizers.Lowercase()
        ),
    ],
    ids=["plain-added-token", "prefix-space", "not-byte-level", "lowercase"],
)
def test_other_tokenizers_keep_their_own_encoding(build):
    encoder = PromptEncoder(build())
    assert not encoder.fast
    assert_same_ids(encoder)


def test_nightshift_tokenizer_hf_keeps_the_tokenizer_itself(monkeypatch):
    monkeypatch.setenv("NIGHTSHIFT_TOKENIZER", "hf")
    encoder = PromptEncoder(trained(pre_tokenizers.ByteLevel(add_prefix_space=False)))
    assert not encoder.fast
    assert_same_ids(encoder)


def test_the_demo_models_and_smollm2_encode_alike_either_way(models, smollm2):
    for path in [*models.values(), smollm2]:
        encoder = PromptEncoder.load(str(path))
        assert encoder.fast
        assert_same_ids(encoder)


def test_a_token_no_merge_makes_keeps_the_tokenizer():
    """Llama 3 has tokens no merge makes (with ignore_merges): tiktoken would form them
    inside longer words, the tokenizer never does, so such a vocabulary is not fast."""
    hf = trained(pre_tokenizers.ByteLevel(add_prefix_space=False))
    described = json.loads(hf.backend_tokenizer.to_str())
    model = described["model"]
    merge = max(model["merges"], key=lambda m: len("".join(m)))  # a long word's last merge
    model["merges"].remove(merge)
    model["ignore_merges"] = True
    changed = Tokenizer.from_str(json.dumps(described))
    encoder = PromptEncoder(PreTrainedTokenizerFast(tokenizer_object=changed, bos_token="<s>"))
    assert not encoder.fast
    assert_same_ids(encoder)


@pytest.mark.parametrize("setting", ["padding", "truncation"])
def test_padding_or_truncation_in_tokenizer_json_never_reaches_a_prompt(setting):
    hf = trained(pre_tokenizers.ByteLevel(add_prefix_space=False))
    plain = PromptEncoder(hf)
    described = json.loads(hf.backend_tokenizer.to_str())
    described[setting] = (
        {"strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": None,
         "pad_id": 1, "pad_type_id": 0, "pad_token": "</s>"}
        if setting == "padding"
        else {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    )  # fmt: skip
    tok = Tokenizer.from_str(json.dumps(described))
    texts = ["a b c d e f g h i j k l m n o p", "hi", "x\x04y"] + hard_texts()
    for fast in ("", "hf"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("NIGHTSHIFT_TOKENIZER", fast)
            encoder = PromptEncoder(PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>"))
            assert encoder.encode_texts(texts) == plain.encode_texts(texts)
            assert encoder._hf_texts(texts) == plain._hf_texts(texts)
