"""Aggregation of run JSONs, tables in the papers' layout, comparisons and figures.

These modules never import torch: they read JSON and CSV only.
"""
