"""Partial parameter averaging: clients share only some of their parameters (FedPer's GCN
layers, FedStar's structure channel); the rest never leaves the client."""

from __future__ import annotations

from torch import Tensor, nn

from fglrepro.fl.aggregation import load_parameters, parameters_of
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.method import ParameterAveraging, Upload


class PartialAveraging(ParameterAveraging):
    """FedAvg (weights n_k / N) over the parameters for which :meth:`shares` holds. A client
    loads the averaged shared parameters before training and keeps its private ones; only its
    own model is meaningful to test (``evaluation.model: local``)."""

    has_global_model = False

    def shares(self, name: str) -> bool:
        """Whether parameter ``name`` is uploaded and averaged."""
        raise NotImplementedError

    def shared_parameters(self, model: nn.Module) -> dict[str, Tensor]:
        """Detached copy of ``model``'s shared parameters."""
        return {name: p for name, p in parameters_of(model).items() if self.shares(name)}

    def receive(self, k: int, round_: int) -> None:
        """Load the averaged shared parameters; the private ones stay as they are."""
        load_parameters(self.states[k].model, self.shared_parameters(self.global_model))

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The shared parameters only."""
        return Upload(params=self.shared_parameters(self.states[k].model),
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def download_bytes(self, k: int) -> int:
        """The averaged shared parameters."""
        return tensor_bytes(self.shared_parameters(self.global_model).values())
