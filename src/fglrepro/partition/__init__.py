"""Graph partitioning into federated clients, client splits, and partition statistics."""
