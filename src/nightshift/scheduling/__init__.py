"""Pure planning logic: prompt rendering, token budgets, ordering. No I/O, no engine."""
