"""nightshift: offline bulk LLM generation over Parquet.

Plan a job (render prompts, count tokens, set aside what cannot run), feed an offline
vLLM engine at maximum batch, write one answer per record, and report what it cost.
"""

import os

# Polars allocates with jemalloc, which keeps what is freed for 10 s before handing it
# back: a plan's steps each free hundreds of MB within seconds, so its peak was the sum
# of the last ten seconds' steps (1M records: 1.42 GiB, against 1.17 with this; the plan
# 7% slower, generation no slower: docs/benchmarks.md (30)). Read once, when polars
# loads, so it is set before any import of it; a value the user set is kept.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0")

__version__ = "0.1.0"

__all__ = ["committed_files"]


def __getattr__(name: str):
    # Lazy: `import nightshift` stays cheap; the reader helper loads the io layer on use.
    if name == "committed_files":
        from nightshift.io.outputs import committed_files

        return committed_files
    raise AttributeError(f"module 'nightshift' has no attribute {name!r}")
