"""fglrepro: a reproducibility pipeline for federated graph learning papers."""

__version__ = "0.1.0"
