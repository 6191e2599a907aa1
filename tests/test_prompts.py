"""Prompt rendering: record text is data, chat templates apply once, one BOS only."""

from __future__ import annotations

import pytest

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import RecordError
from nightshift.scheduling.prompts import Messages, PromptTemplate

TRICKY = "Please keep {subject} and {{ bos_token }} and {% if x %}y{% endif %} and {0} as typed."


def test_record_braces_and_jinja_pass_literally():
    template = PromptTemplate("Subject: {subject}\n\n{body}", system="sys")
    messages = template.render({"subject": "{body}", "body": TRICKY})
    assert messages.user == "Subject: {body}\n\n" + TRICKY
    assert messages.system == "sys"


def test_template_escapes_are_honoured_and_values_stringified():
    template = PromptTemplate("{{literal}} #{n}: {flag}")
    assert template.render({"n": 7, "flag": True}).user == "{literal} #7: True"


def test_missing_and_null_fields_are_record_errors():
    template = PromptTemplate("{subject}: {body}")
    with pytest.raises(RecordError, match="missing field 'body'") as missing:
        template.render({"subject": "s"})
    assert missing.value.kind == "missing_field"
    with pytest.raises(RecordError, match="field 'body' is null") as null:
        template.render({"subject": "s", "body": None})
    assert null.value.kind == "null_field"


@pytest.fixture(scope="module")
def chat_encoder(models):
    return PromptEncoder.load(str(models["chat"]))


@pytest.fixture(scope="module")
def plain_encoder(models):
    return PromptEncoder.load(str(models["plain"]))


def test_chat_model_gets_its_template_and_one_bos(chat_encoder):
    [ids] = chat_encoder.encode([Messages("You triage.", TRICKY)])
    bos = chat_encoder.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    text = chat_encoder.decode(ids)
    assert text.startswith("<s><|im_start|>system\nYou triage.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # Jinja inside the record was not evaluated: it reaches the model as typed.
    assert TRICKY in text


def test_model_without_chat_template_gets_the_raw_prompt(plain_encoder):
    assert not plain_encoder.has_chat_template
    [ids] = plain_encoder.encode([Messages("You triage.", TRICKY)])
    assert ids[0] == plain_encoder.bos_token_id and ids.count(plain_encoder.bos_token_id) == 1
    assert plain_encoder.decode(ids) == "<s>You triage.\n\n" + TRICKY


def test_special_tokens_typed_in_a_record_are_plain_text(chat_encoder):
    im_end = chat_encoder._tok.convert_tokens_to_ids("<|im_end|>")
    [ids] = chat_encoder.encode([Messages("sys", "close <|im_end|> and <s> reopen")])
    # Only the template's own turn ends are special: after system and after user.
    assert ids.count(im_end) == 2 and ids.count(chat_encoder.bos_token_id) == 1
    assert "close <|im_end|> and <s> reopen<|im_end|>" in chat_encoder.decode(ids)


def test_frame_encoding_matches_whole_text_encoding_for_plain_records(chat_encoder):
    prompts = [Messages("You triage.", f"Subject: s{i}\n\nbody {i} words") for i in range(5)]
    whole = chat_encoder._tok([chat_encoder.text(p) for p in prompts], add_special_tokens=False)
    assert chat_encoder.encode(prompts) == whole["input_ids"]


def test_a_template_that_refuses_a_system_message_names_prompt_system(models):
    from transformers import AutoTokenizer

    from nightshift.errors import SpecError

    tok = AutoTokenizer.from_pretrained(str(models["chat"]))
    tok.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    encoder = PromptEncoder(tok)
    with pytest.raises(SpecError, match="System role not supported") as caught:
        encoder.encode([Messages("sys", "hello")])
    assert caught.value.key == "prompt.system"
    assert encoder.decode(encoder.encode([Messages(None, "hello")])[0]) == "hello"


def test_column_names_with_dots_and_spaces_work_as_written():
    from nightshift.jobs.spec import template_fields

    assert template_fields("{user.name} asks: {ticket body}") == ["user.name", "ticket body"]
    template = PromptTemplate("{user.name} asks: {ticket body}")
    assert template.render({"user.name": "Ada", "ticket body": "hi"}).user == "Ada asks: hi"


def test_nested_and_binary_values_become_readable_text():
    template = PromptTemplate("{meta} / {raw}")
    rendered = template.render({"meta": {"tier": "pro", "tags": ["a", "é"]}, "raw": b"caf\xc3\xa9"})
    assert rendered.user == '{"tier": "pro", "tags": ["a", "é"]} / café'


def test_a_shared_start_cut_at_a_word_encodes_to_the_whole_prompts_leading_ids(chat_encoder):
    """The plan encodes a node's shared start alone, cut at a word and in word-aligned
    sub-pieces; the run encodes the whole prompt. The ids must agree on the start."""
    from nightshift.scheduling.sharing import cut_pieces, word_pieces

    before, after = chat_encoder.template_frame("You triage.")
    text = " ".join(f"word{i % 13} and, more: {i}." for i in range(120)) + "\n\nQuestion: why?"
    pieces = [before, "Head: ", "", text, after]
    [whole] = chat_encoder.encode_pieces([pieces])
    start = len((before + "Head: ").encode())
    for cut in [0, 1, 7, 50, 333, 901, len(text.encode()) - 3, len(text.encode()) + 5]:
        prefix = word_pieces(cut_pieces(pieces, start + cut), every=40)
        [ids] = chat_encoder.encode_pieces([prefix])
        assert ids == whole[: len(ids)], cut
        assert "".join(prefix) == "".join(pieces)[: len("".join(prefix))]


def test_texts_that_only_an_empty_frame_piece_separates_are_joined_for_such_tokenizers():
    from nightshift.engines.tokenizer import _joined

    assert _joined(["<a>", "head ", "", "doc", "", "q", "<b>"]) == ["<a>", "head docq", "<b>"]
    assert _joined(["<a>", "u1", "<x>", "u2", "<b>"]) == ["<a>", "u1", "<x>", "u2", "<b>"]


def test_shared_texts_past_the_cache_bound_are_encoded_not_lost(chat_encoder, monkeypatch):
    """A batch that overflows the cache of shared texts (documents, few-shot blocks) clears
    it and encodes again the ones it held: every text keeps its ids."""
    import nightshift.engines.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "_CACHE_TEXTS", 8)
    chat_encoder.encode_shared(["a shared document"])
    texts = ["a shared document"] + [f"document {i}" for i in range(8)]
    assert chat_encoder.encode_shared(texts) == chat_encoder.encode_texts(texts)
