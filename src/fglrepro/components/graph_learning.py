"""Graph structure for graphless clients (FedGLS, Fu et al., TMLR 2024, Appendix B): the cosine
kNN adjacency processor, the attentive graph learner built on it, and FedGLS's contrastive loss.

The processor is SUBLIME's (Liu et al., WWW 2022), which FedGLS cites for it: cosine
similarity, top-(k+1) per row (the node itself and its k most similar nodes), ReLU,
``(S + S^T) / 2``, ``D^-1/2 S D^-1/2``. Applied to the features it is the kNN graph of the
Local-GNNk / Fed-GNNk baselines; applied to the attentive encoder's output it is FedGLS's
learned graph, which therefore starts as that kNN graph (the encoder's weights start at 1).

With ``sparse`` the graph learner reads sparse (bag-of-words) features through their non-zero
entries only: the attentive encoder keeps zeros at zero, so the cosine similarity of two nodes
needs only their non-zero features (an embedding bag, ``O(nnz · n)`` instead of ``O(n² F)``),
equal up to float rounding (FedGLS's fast path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def knn_similarity(embeddings: Tensor, k: int) -> Tensor:
    r"""Eqs. 16-17 before symmetrisation: ``[n, n]`` with :math:`\mathrm{ReLU}(\cos(e_i, e_j))` where
    j is among the ``k + 1`` most similar rows to i (the node itself included), else 0;
    ``embeddings [n, d]``. Differentiable with respect to the kept similarities."""
    unit = F.normalize(embeddings, dim=1)
    return knn_sparsify(unit @ unit.t(), k)


def knn_sparsify(similarity: Tensor, k: int) -> Tensor:
    """The kept entries of a similarity ``[n, n]``: ReLU of the ``k + 1`` largest of each
    row, zeros elsewhere (eqs. 16-17 before symmetrisation)."""
    keep = similarity.topk(min(k + 1, similarity.size(1)), dim=1).indices
    mask = torch.zeros_like(similarity, dtype=torch.bool).scatter_(1, keep, True)
    return F.relu(similarity * mask)


def sparse_cosine_similarity(rows: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    """``[n, n]`` cosine similarity of the rows of the sparse ``[n, F]`` matrix with the
    non-zero entries ``(rows, columns, values)`` (``rows`` sorted), differentiable in
    ``values``: :func:`torch.nn.functional.normalize` row by row, then one embedding bag per
    row over its non-zero columns. A row without non-zeros has similarity 0 with every row."""
    n, num_features = shape
    norms = values.new_zeros(n).index_add(0, rows, values * values).clamp_min(1e-24).sqrt()
    unit = values / norms[rows]
    transposed = values.new_zeros(num_features, n).index_put((columns, rows), unit)
    per_row = torch.bincount(rows, minlength=n)
    offsets = torch.cumsum(per_row, 0) - per_row
    return F.embedding_bag(columns, transposed, offsets, mode="sum", per_sample_weights=unit)


def symmetric_normalized(adj: Tensor) -> Tensor:
    """Eqs. 17-18 on a non-negative ``adj [n, n]``: ``D^-1/2 (A + A^T)/2 D^-1/2``, D the row
    sums of the symmetrised matrix (a row of zeros stays zero)."""
    symmetric = (adj + adj.t()) / 2
    inv_sqrt = symmetric.sum(dim=1).clamp(min=1e-12).rsqrt()
    return inv_sqrt.unsqueeze(1) * symmetric * inv_sqrt.unsqueeze(0)


def cosine_knn_adjacency(embeddings: Tensor, k: int) -> Tensor:
    """Dense normalised adjacency ``[n, n]`` of the cosine kNN graph of ``embeddings [n, d]``
    (eqs. 16-18): :func:`symmetric_normalized` of :func:`knn_similarity`."""
    return symmetric_normalized(knn_similarity(embeddings, k))


class AttentiveEncoder(nn.Module):
    """``layers`` attentive layers (eq. 15): ``R^(l) = ReLU(R^(l-1) diag(w^(l)))`` with
    ``w^(l) [F]`` initialised to ones, so that for non-negative features the encoder starts as
    the identity. ``x [n, F]`` -> ``[n, F]``."""

    def __init__(self, num_features: int, layers: int = 2) -> None:
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.ones(num_features)) for _ in range(layers))

    def forward(self, x: Tensor) -> Tensor:
        for weight in self.weights:
            x = F.relu(x * weight)
        return x

    def forward_nonzeros(self, values: Tensor, columns: Tensor) -> Tensor:
        """The encoder on the non-zero entries ``values [nnz]`` in feature ``columns [nnz]``
        of a sparse input (its zeros stay zero)."""
        for weight in self.weights:
            values = F.relu(values * weight[columns])
        return values


class GraphLearner(nn.Module):
    """FedGLS's graph learner ``S = Ω(Φ(Enc(X; ω)))`` (eq. 5, 13): the attentive encoder, cosine
    similarity and the kNN processor of :func:`cosine_knn_adjacency`. ``x [n, F]`` -> ``[n, n]``.

    Args:
        num_features: F. k: neighbours per node. layers: of the attentive encoder.
        sparse: compute the similarity from the non-zero features only
            (:func:`sparse_cosine_similarity`; for sparse ``x``, see the module docstring).
    """

    def __init__(self, num_features: int, k: int, layers: int = 2, sparse: bool = False) -> None:
        super().__init__()
        self.k, self.sparse = k, sparse
        self.encoder = AttentiveEncoder(num_features, layers)

    def forward(self, x: Tensor) -> Tensor:
        if not self.sparse:
            return cosine_knn_adjacency(self.encoder(x), self.k)
        rows, columns = x.nonzero(as_tuple=True)
        values = self.encoder.forward_nonzeros(x[rows, columns], columns)
        similarity = sparse_cosine_similarity(rows, columns, values, tuple(x.shape))
        return symmetric_normalized(knn_sparsify(similarity, self.k))


def graphless_contrastive_loss(z: Tensor, h: Tensor, temperature: float) -> Tensor:
    r"""FedGLS eqs. 8-9: the mean over nodes i of

    .. math:: \ell_i = -\log \frac{e^{s(z_i, h_i)/\tau}}
              {\sum_{j \ne i} \left[e^{s(z_i, h_j)/\tau} + e^{s(z_i, z_j)/\tau}\right]}

    with cosine similarity s: one direction (from the GNN embeddings ``z [n, d]`` to the
    encoder's ``h [n, d]``), the positive pair not in the denominator.
    """
    z_unit, h_unit = F.normalize(z, dim=1), F.normalize(h, dim=1)
    cross, within = z_unit @ h_unit.t() / temperature, z_unit @ z_unit.t() / temperature
    off_diagonal = ~torch.eye(z.size(0), dtype=torch.bool, device=z.device)
    negatives = torch.cat([cross.masked_fill(~off_diagonal, float("-inf")),
                           within.masked_fill(~off_diagonal, float("-inf"))], dim=1)
    return (torch.logsumexp(negatives, dim=1) - cross.diagonal()).mean()
