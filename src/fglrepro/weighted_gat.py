r"""PyG's ``GATConv`` that also takes edge weights (the GAT of :class:`fglrepro.models.PyGNet`).

Its own module so that :mod:`fglrepro.models` imports PyG only when a GAT is built, while the
class stays importable by name (checkpoints pickle the models).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv
from torch_geometric.utils import softmax


class WeightedGATConv(GATConv):
    r"""``GATConv(in_channels, out_channels)`` (one head; the same parameters and initialisation)
    whose attention, when called with ``edge_attr = log w [E]``, is

    .. math:: \alpha_{ij} \propto w_{ij} \exp\big(\mathrm{LeakyReLU}(a^\top [W x_i \| W x_j])\big),

    self-loops weighing 1 (``fill_value = 0 = log 1``). Without ``edge_attr`` it is
    ``GATConv`` itself, the same operations: GAT on an unweighted graph is the case ``w = 1``.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, fill_value=0.0)

    def edge_update(self, alpha_j: Tensor, alpha_i: Tensor | None, edge_attr: Tensor | None, index: Tensor,
                    ptr: Tensor | None, dim_size: int | None) -> Tensor:
        """Attention ``[E, 1]`` of each edge (softmax over each target's incoming edges)."""
        if edge_attr is None:
            return super().edge_update(alpha_j, alpha_i, edge_attr, index, ptr, dim_size)
        alpha = F.leaky_relu(alpha_j + alpha_i, self.negative_slope) + edge_attr.view(-1, 1)
        return F.dropout(softmax(alpha, index, ptr, dim_size), p=self.dropout, training=self.training)
