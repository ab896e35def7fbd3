"""The shared federated machinery: client data, local training, aggregation, round loop."""
