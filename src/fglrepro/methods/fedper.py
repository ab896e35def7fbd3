"""FedPer (Arivazhagan et al., 2019, "Federated learning with personalization layers"), as
FedGKD's App. D.2 describes it: clients send only the GCN layers to the server, which
averages them (weights n_k / N); the READOUT layer never leaves the client."""

from __future__ import annotations

from fglrepro.config import ConfigError
from fglrepro.fl.method import RunSetup
from fglrepro.fl.partial import PartialAveraging
from fglrepro.methods import register


@register("fedper")
class FedPer(PartialAveraging):
    """Each client keeps its own READOUT; its GCN layers start every round from the server's
    average."""

    label = "FedPer"
    vectorised = True

    @staticmethod
    def shares(name: str) -> bool:
        """Every parameter outside the READOUT layer (``readout.*``)."""
        return not name.startswith("readout.")

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        if setup.model.arch != "gcn" or not setup.model.readout:
            raise ConfigError("fedper keeps the READOUT layer local: it needs model.arch 'gcn' with "
                              f"model.readout true, got arch {setup.model.arch!r}, readout {setup.model.readout}")
