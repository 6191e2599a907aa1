"""Task handlers: answer budgets and parsing of answers."""

from __future__ import annotations

import copy

import pytest

from nightshift.errors import RecordError
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.tasks import answer_budget, handler_for

from .conftest import spec_dict

BASE = spec_dict("m", "in", "out")


def spec_with(**sections):
    data = copy.deepcopy(BASE)
    data.update(sections)
    return validate_spec(data)


def test_classify_budget_covers_the_longest_label_in_bytes():
    spec = spec_with(sampling={"max_tokens": 2})
    assert answer_budget(spec) == len("feature_request") + 1
    assert answer_budget(spec_with(sampling={"max_tokens": 64})) == 64


def test_generate_budget_is_max_tokens():
    assert answer_budget(spec_with(task={"kind": "generate"}, sampling={"max_tokens": 3})) == 3


def test_classify_parse_accepts_only_labels():
    handler = handler_for(spec_with().task)
    assert handler.parse(" bug\n", "stop") == {"label": "bug", "confidence": None}
    with pytest.raises(RecordError, match="not one of the labels"):
        handler.parse("feature_re", "length")


def test_extract_parse_validates_and_normalises():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    handler = handler_for(spec_with(task={"kind": "extract", "schema": schema}).task)
    assert handler.parse('{ "n" : 3 }', "stop") == {"json": '{"n":3}'}
    with pytest.raises(RecordError, match="does not match task.schema"):
        handler.parse('{"n": "three"}', "stop")
    with pytest.raises(RecordError, match="cut off by sampling.max_tokens"):
        handler.parse('{"n": ', "length")
