"""Evaluation: scoring committed answers against labels or a reference.

``metrics`` (pure functions over lists), ``score`` (which records count, over polars
frames), ``read`` (committed rows and label files, through the commit markers) and
``quality`` (the report's section and ``jobs eval``). ``reports`` imports this stage,
never the reverse.
"""
