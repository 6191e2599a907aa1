"""Capacity planning: predict throughput, time, cost and the binding limit before a run.

Pure arithmetic over the model's shape (from its config.json, no weights), a table of
GPUs and the job's real token counts. Nothing here imports vLLM.
"""
