"""How the benchmarks take turns between the sides they compare."""

from __future__ import annotations


def alternated(sides: list[str], reps: int) -> list[str]:
    """Each side ``reps`` times, the order reversed every other round (A B C C B A ...),
    so that a drift in the machine's speed falls on every side alike."""
    return [s for i in range(reps) for s in (sides if i % 2 == 0 else sides[::-1])]
