"""nightshift: offline bulk LLM generation over Parquet.

Plan a job (render prompts, count tokens, set aside what cannot run), feed an offline
vLLM engine at maximum batch, write one answer per record, and report what it cost.
"""

__version__ = "0.1.0"

__all__ = ["committed_files"]


def __getattr__(name: str):
    # Lazy: `import nightshift` stays cheap; the reader helper loads the io layer on use.
    if name == "committed_files":
        from nightshift.io.outputs import committed_files

        return committed_files
    raise AttributeError(f"module 'nightshift' has no attribute {name!r}")
