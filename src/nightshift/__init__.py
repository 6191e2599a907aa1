"""nightshift: offline bulk LLM generation over Parquet.

Plan a job (render prompts, count tokens, set aside what cannot run), feed an offline
vLLM engine at maximum batch, write one answer per record, and report what it cost.
"""

__version__ = "0.1.0"
