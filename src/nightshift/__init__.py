"""nightshift: offline bulk LLM generation over Parquet.

Plan a job (render prompts, count tokens, set aside what cannot run), feed an offline
vLLM engine at maximum batch, write one answer per record, and report what it cost.
"""

import os

# Polars allocates with jemalloc and has it keep freed pages for a while (polars sets
# dirty_decay_ms:500,muzzy_decay_ms:1000 and appends this variable, whose values win): a
# plan's steps free hundreds of MB a second, so its peak held the last steps' leftovers
# too (docs/benchmarks.md (30): at a million records a lower peak and a slower plan,
# generation no slower). jemalloc reads it once, when polars loads: it holds for every
# nightshift command and the processes they start, and for a program that imports
# nightshift before polars. A value the user set is kept.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0")

__version__ = "0.1.0"

__all__ = ["committed_files"]


def __getattr__(name: str):
    # Lazy: `import nightshift` stays cheap; the reader helper loads the io layer on use.
    if name == "committed_files":
        from nightshift.io.outputs import committed_files

        return committed_files
    raise AttributeError(f"module 'nightshift' has no attribute {name!r}")
