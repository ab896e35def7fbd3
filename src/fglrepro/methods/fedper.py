"""FedPer (Arivazhagan et al., 2019, "Federated learning with personalization layers"), as
FedGKD's App. D.2 describes it: clients send only the GCN layers to the server, which
averages them (weights n_k / N); the READOUT layer never leaves the client. Without a
READOUT the last GCN layer (the classifier) is the personal layer."""

from __future__ import annotations

from fglrepro.components.partial import PartialAveraging
from fglrepro.config import ConfigError
from fglrepro.fl.method import Federation, RunSetup
from fglrepro.methods import register


@register("fedper")
class FedPer(PartialAveraging):
    """Each client keeps its own personal layer; the other layers start every round from the
    server's average."""

    label = "FedPer"
    vectorised = True

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        model = federation.model
        self.personal = "readout." if model.readout is not None else f"convs.{len(model.convs) - 1}."

    def shares(self, name: str) -> bool:
        """Every parameter outside the personal layer (``readout.*``, else the last GCN layer)."""
        return not name.startswith(self.personal)

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        if setup.model.arch != "gcn":
            raise ConfigError(f"fedper splits a GCN into shared and personal layers; got model.arch "
                              f"{setup.model.arch!r}, use 'gcn'")
