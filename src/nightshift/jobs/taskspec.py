"""The job spec's task section: what is asked of every record (``task.kind``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from nightshift.jobs.section import Section as _Section
from nightshift.jobs.section import without_defaults as _without_defaults


class GenerateTask(_Section):
    kind: Literal["generate"] = Field(description="Free text generation.")


class ClassifyTask(_Section):
    kind: Literal["classify"] = Field(description="Pick exactly one label per record.")
    labels: list[str] = Field(
        min_length=2,
        description="The allowed labels; every record gets exactly one of them.",
    )
    calibrate: bool = Field(
        True,
        description="Score every label by the probability of its first token and take out "
        "the model's leaning toward some labels, measured on a sample of the job's own "
        "records before the run (calibration); the output's confidence column is the "
        "label's probability. false: generate a label by guided choice, as vLLM's "
        "guided_choice does. Labels that start with one same token always use guided choice.",
    )
    calibration_records: int = Field(
        32,
        ge=4,
        le=4096,
        description="Records of the job scored to measure the model's leaning (spread "
        "over the plan; their answers are not kept, they are scored again in the run).",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Defaults left out: a classify job's task (and fingerprint) reads as it did
        # before calibration existed; plan.json's labels_by says how its labels are made.
        return _without_defaults(handler(self), {"calibrate": True, "calibration_records": 32})

    @field_validator("labels")
    @classmethod
    def _labels_distinct(cls, labels: list[str]) -> list[str]:
        if len(set(labels)) != len(labels) or any(not label for label in labels):
            raise ValueError("labels must be distinct, non-empty strings")
        return labels


class ExtractTask(_Section):
    kind: Literal["extract"] = Field(description="Extract fields as JSON.")
    json_schema: dict[str, Any] = Field(
        alias="schema",
        description="JSON schema every answer must match; guided decoding enforces it.",
    )

    @field_validator("json_schema")
    @classmethod
    def _schema_is_valid(cls, schema: dict[str, Any]) -> dict[str, Any]:
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"is not a valid JSON schema: {exc.message}") from None
        return schema


class EmbedTask(_Section):
    kind: Literal["embed"] = Field(
        description="One embedding vector per record, from vLLM's pooling runner (prompt "
        "tokens only: no sampling, no answer tokens); settings in the embed section."
    )


class EmbedSpec(_Section):
    """``embed``: how a ``task.kind: embed`` job's vectors are made."""

    normalize: bool = Field(
        True, description="Scale every vector to length 1 (cosine similarity is then a dot)."
    )
    dimensions: int | None = Field(
        None,
        gt=0,
        description="Keep the first this many dimensions, for models trained for it "
        "(Matryoshka); vLLM refuses it for other models, before any record runs.",
    )


TaskSpec = Annotated[
    GenerateTask | ClassifyTask | ExtractTask | EmbedTask, Field(discriminator="kind")
]
