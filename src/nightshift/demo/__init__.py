"""A demo model and dataset built locally, so nothing comes from a hub."""
