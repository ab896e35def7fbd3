"""Datasets: registry, verified download, and the canonical prepared graph."""
