"""Prefect flows and schedules: thin shells over ``running`` and ``reports``. Only this
package imports Prefect; ``direct`` runs the same steps without it."""
