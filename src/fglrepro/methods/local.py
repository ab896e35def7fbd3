"""Local: every client trains alone on its subgraph, no communication."""

from __future__ import annotations


from torch import nn

from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.fl.training import make_optimizer, train_epochs
from fglrepro.methods import register


@register("local")
class Local(FederatedMethod):
    """Isolated training; ``eval_model`` is each client's own model."""

    label = "Local"
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        self.models = [federation.client_model(k) for k in range(len(self.clients))]
        self.optimizers = [make_optimizer(m, federation.train) for m in self.models]

    def client_update(self, k: int, round_: int) -> Upload:
        loss = train_epochs(self.models[k], self.optimizers[k], self.clients[k], self.federation.train.local_epochs)
        return Upload(tensors={}, weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Nothing to aggregate."""

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.models[k]
