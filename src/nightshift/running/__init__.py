"""The run stage: shards through engines.

``runner.start_run`` takes up (or builds) the plan and lists the shards left; ``engines``
maps the spec to an engine and keeps it warm; ``shards.ShardRunner`` feeds the plan's
records (``feed``, ``prefetch``), turns results into rows (``results``), checkpoints and
commits; ``progress``, ``totals`` and ``workerstats`` keep the figures the report uses."""
