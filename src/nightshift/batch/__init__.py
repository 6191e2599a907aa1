"""Provider batch files (OpenAI, Anthropic) run as nightshift jobs.

``openai`` and ``anthropic`` read the providers' JSONL request lines into one records
table (``records``: custom_id, line, messages or prompt, per-record sampling) and error
lines for the bad ones; ``run`` plans and runs that table as a job; ``results`` writes
the job's answers back in the provider's own output and error line shapes.
"""
