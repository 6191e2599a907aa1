"""Prefect flows and schedules: thin shells over jobs.runner. Only this package imports Prefect."""
