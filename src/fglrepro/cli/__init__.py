"""Small command-line entry points, one per workflow stage."""
