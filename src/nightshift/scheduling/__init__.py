"""The plan stage: from the spec and the input to a plan on disk.

The pure core (``prompts``, ``budget``, ``order``, ``reuse``) does no I/O and touches no
engine. Around it: ``measure`` (token counts with the model's tokenizer), ``plan`` (the one
place that reads input for a plan, and builds it), ``increments``, ``kvcache``,
``capacity`` (the capacity model applied to a plan) and ``dryrun`` (``jobs plan``)."""
