"""The run stage: shards through engines.

``runner.start_run`` takes up (or builds) the plan and lists the shards left; ``engines``
maps the spec to an engine, ``warm`` keeps it warm between jobs; ``shards.ShardRunner``
feeds the plan's records (``feed``, ``prefetch``), turns results into rows (``results``),
and ``settling`` checkpoints, commits and retries its shards; ``progress``, ``totals``
and ``workerstats`` keep the figures the report uses."""
