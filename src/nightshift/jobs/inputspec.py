"""The job spec's ``input:`` section: where the records come from and which of their
columns travel on (the id, kept columns, per-record sampling and adapter).

An input column may not take the name of a column nightshift writes beside it
(``jobs.columns``), so each check here names the clash and the key to change.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from nightshift.jobs.columns import DETAIL_COLUMNS, OUTPUT_COLUMNS, kept_name
from nightshift.jobs.section import Section as _Section
from nightshift.jobs.section import without_defaults as _without_defaults


class InputSpec(_Section):
    path: str = Field(
        description="Parquet input: a file, a glob such as data/*.parquet, or a directory "
        "(every *.parquet below it). Relative paths are taken from the working directory."
    )
    id_column: str = Field(
        description="Column holding each record's unique id; results are matched by it."
    )

    @field_validator("id_column")
    @classmethod
    def _id_column_does_not_clash(cls, column: str) -> str:
        if column in OUTPUT_COLUMNS:
            raise ValueError(
                f"{column} is also the name of an output column; rename it in the input"
            )
        return column

    keep_columns: list[str] = Field(
        default_factory=list,
        description="Input columns copied unchanged into every output and reject row.",
    )

    @field_validator("keep_columns")
    @classmethod
    def _keep_columns_do_not_clash(cls, columns: list[str]) -> list[str]:
        columns = list(dict.fromkeys(columns))
        names = [kept_name(c) for c in columns]  # text is written as input_text
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ValueError(
                f"{', '.join(clash)} would be written twice (a kept column named like an "
                "output column is written as input_<name>); leave one of them out"
            )
        return columns

    sampling_column: str | None = Field(
        default=None,
        description="Column of JSON strings, one per record, each overriding the sampling "
        "section for that record: max_tokens, temperature, top_p, top_k, seed, stop, n, "
        "json_schema or json_object (guided decoding), logprobs and top_logprobs. A key "
        "left out or null keeps the job's value. A value that does not parse or is out of "
        "range rejects its record (bad_sampling). Results then gain a detail column (JSON: "
        "every choice, its finish and stop sequence, tokens and logprobs).",
    )

    adapter_column: str | None = Field(
        default=None,
        description="Column naming each record's LoRA adapter (a key of model.adapters); "
        "null runs the base model. An unknown name rejects its record (unknown_adapter).",
    )

    @model_validator(mode="after")
    def _detail_does_not_clash(self) -> InputSpec:
        clash = sorted(DETAIL_COLUMNS & {self.id_column})  # a kept one: input_<name>
        if self.sampling_column is not None and clash:
            raise ValueError(
                f"with sampling_column, results have a {', '.join(clash)} column; rename "
                "the input column of that name or leave it out"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Unset, the key is left out: an older job's input (and fingerprint) reads as before.
        return _without_defaults(handler(self), {"sampling_column": None, "adapter_column": None})
