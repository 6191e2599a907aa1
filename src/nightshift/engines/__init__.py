"""Generation engines behind one small protocol. Only this package imports vLLM, lazily.

Engines know nothing of the job spec: ``running.engines`` maps a spec to an engine."""
