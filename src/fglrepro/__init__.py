"""fglrepro: a reproducibility pipeline for federated graph learning papers."""

from fglrepro.pyg_import import install as _install_pyg_import

_install_pyg_import()

__version__ = "0.1.0"
