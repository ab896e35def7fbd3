r"""Sparse bag-of-words features times a dense weight: the first layer of every model.

Features ``X [n, D]`` with few non-zeros (Cora 1.3 %, CiteSeer 0.9 %) are kept as the non-zeros
of their rows (:class:`SparseRows`). The product

.. math:: X W, \qquad \frac{\partial L}{\partial W} = X^\top G

for a dense ``W [D, H]`` is an embedding bag over the rows of ``W`` (sum mode, the entries as
per-sample weights), and the weight gradient one CSR product with ``X^T``
(:class:`FeatureTranspose`, built once per pattern). The model zoo uses it per client
(:func:`fglrepro.models.feature_linear`), the vectorised engine for all clients at once (their
features side by side as one ``[N, m * F]`` matrix).

Propagation over a symmetric sparse CSR operator ``A`` (:func:`symmetric_propagation`) passes the
gradient ``A^T G`` as ``A G``: autograd would build the transposed CSR in every backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from fglrepro.fl.buffers import BufferPool


@dataclass(frozen=True)
class FeatureTranspose:
    """``X^T [D, n]`` of sparse features ``X [n, D]``, for the weight gradient ``X^T G [D, H]``.

    torch's CSR product pays for every row of ``X^T``, empty or not; with client-stacked
    features (``D = m * F``, client i's nodes only in rows ``i*F .. i*F+F-1``) most rows are
    empty, and the cost would grow with ``m * F`` instead of the non-zeros. So when fewer than
    half of the rows are non-empty, only those are kept (``csr [D', n]``, their positions
    ``rows [D']``) and the product is scattered into a zero ``[D, H]`` from ``pool``: the
    same values, row for row. ``order [nnz]`` puts the row-major entries of ``X`` in the
    CSR's order (:meth:`with_values`). With 0/1 features (``binary``: every stored entry is 1)
    row j of the product is the sum of the rows of ``G`` at row j's columns, an embedding bag
    over ``G``: the same sums in the same order (bit for bit), 3-7x faster than the CSR product.
    """

    csr: Tensor
    rows: Tensor | None
    num_rows: int
    order: Tensor
    binary: bool
    pool: BufferPool = field(default_factory=BufferPool, compare=False)

    @classmethod
    def of(cls, rows: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int]) -> "FeatureTranspose":
        """The transpose of the matrix ``shape = (n, D)`` with ``values`` at (``rows``,
        ``columns``), distinct positions (rows without any entry included)."""
        n, width = shape
        order = torch.argsort(columns * n + rows)
        per_row = torch.bincount(columns, minlength=width)
        filled = per_row > 0
        kept = None
        if 2 * int(filled.sum()) < width:
            kept, per_row = filled.nonzero().flatten(), per_row[filled]
        crow = F.pad(per_row.cumsum(0), (1, 0))
        csr = torch.sparse_csr_tensor(crow, rows[order], values[order], (per_row.numel(), n))
        return cls(csr=csr, rows=kept, num_rows=width, order=order, binary=bool((values == 1).all()))

    def with_values(self, values: Tensor) -> "FeatureTranspose":
        """The same pattern with other entries ``values [nnz]`` (in the row-major order of ``X``)."""
        csr = torch.sparse_csr_tensor(self.csr.crow_indices(), self.csr.col_indices(), values[self.order],
                                      self.csr.shape)
        return FeatureTranspose(csr=csr, rows=self.rows, num_rows=self.num_rows, order=self.order,
                                binary=bool((values == 1).all()), pool=self.pool)

    def matmul(self, grad: Tensor) -> Tensor:
        """``X^T grad``: ``grad [n, H]`` -> ``[D, H]``. The CSR product and the scatter of kept rows
        write into buffers of :attr:`pool` (a fresh multi-megabyte result per step costs more than the
        product itself); the embedding bag of ``binary`` features allocates its result (it takes no
        ``out``) and is still the faster of the two."""
        width = grad.size(1)
        if self.binary:
            product = F.embedding_bag(self.csr.col_indices(), grad, self.csr.crow_indices()[:-1], mode="sum")
        else:
            product = self.pool.empty((self.csr.size(0), width), grad.dtype, grad.device)
            torch.mm(self.csr, grad, out=product)
        if self.rows is None:
            return product
        return self.pool.zeros((self.num_rows, width), product).index_copy_(0, self.rows, product)


@dataclass(eq=False)
class SparseRows:
    """The non-zeros of features ``X [n, D]``, row by row.

    Attributes:
        rows, columns, values: ``[nnz]`` position and value of each non-zero, row-major.
        offsets: ``[n]`` position in ``columns`` of each row's first non-zero.
        shape: ``(n, D)``.
    """

    rows: Tensor
    columns: Tensor
    values: Tensor
    offsets: Tensor
    shape: tuple[int, int]
    _transpose: FeatureTranspose | None = field(default=None, repr=False)
    _pattern: SparseRows | None = field(default=None, repr=False)

    @classmethod
    def entries(cls, rows: Tensor, columns: Tensor, values: Tensor, shape: tuple[int, int]) -> "SparseRows":
        """From row-major ``(rows, columns, values)`` of a matrix of ``shape``."""
        per_row = torch.bincount(rows, minlength=shape[0])
        return cls(rows=rows, columns=columns, values=values, offsets=per_row.cumsum(0) - per_row, shape=shape)

    @classmethod
    def of(cls, x: Tensor) -> "SparseRows":
        """The non-zeros of the dense ``x [n, D]``."""
        rows, columns = x.nonzero(as_tuple=True)
        return cls.entries(rows, columns, x[rows, columns], tuple(x.shape))

    @classmethod
    def concatenated(cls, blocks: list[Tensor]) -> "SparseRows":
        """The non-zeros of the dense row blocks ``blocks [n_i, D]`` stacked, ``[sum n_i, D]``: the
        entries :meth:`of` gives on their concatenation, without forming it."""
        pieces = [block.nonzero(as_tuple=True) for block in blocks]
        offsets = torch.tensor([0] + [block.size(0) for block in blocks]).cumsum(0).tolist()
        rows = torch.cat([r + offset for (r, _), offset in zip(pieces, offsets)])
        values = torch.cat([block[r, c] for block, (r, c) in zip(blocks, pieces)])
        columns = torch.cat([c for _, c in pieces])
        return cls.entries(rows, columns, values, (offsets[-1], blocks[0].size(1)))

    def with_values_of(self, x: Tensor) -> "SparseRows":
        """The same pattern with the entries of ``x [n, D]`` (zero wherever this pattern is not)."""
        return SparseRows(self.rows, self.columns, x[self.rows, self.columns], self.offsets, self.shape,
                          _pattern=self)

    def transposed(self) -> FeatureTranspose:
        """``X^T`` (built on first use; from the pattern's, for :meth:`with_values_of`)."""
        if self._transpose is None:
            if self._pattern is not None:
                self._transpose = self._pattern.transposed().with_values(self.values)
            else:
                self._transpose = FeatureTranspose.of(self.rows, self.columns, self.values, self.shape)
        return self._transpose


class _SparseMatmul(torch.autograd.Function):
    """``X W`` for sparse rows ``X [n, D]`` and a dense ``W [D, H]``."""

    @staticmethod
    def forward(ctx, weight: Tensor, rows: SparseRows) -> Tensor:
        ctx.rows = rows
        return F.embedding_bag(rows.columns, weight, rows.offsets, mode="sum", per_sample_weights=rows.values)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return ctx.rows.transposed().matmul(grad), None


def sparse_matmul(rows: SparseRows, weight: Tensor) -> Tensor:
    """``X W``: ``rows`` of ``X [n, D]``, ``weight [D, H]`` (contiguous) -> ``[n, H]``; the
    gradient flows to ``weight`` only."""
    return _SparseMatmul.apply(weight, rows)


class _SymmetricPropagation(torch.autograd.Function):
    """``A H`` for a symmetric sparse CSR ``A``: the gradient ``A^T G`` is ``A G``, which
    spares autograd's transposition of the CSR matrix in every backward pass."""

    @staticmethod
    def forward(ctx, adj: Tensor, h: Tensor) -> Tensor:
        ctx.adj = adj
        return torch.sparse.mm(adj, h)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, torch.sparse.mm(ctx.adj, grad)


def symmetric_propagation(adj: Tensor, h: Tensor) -> Tensor:
    """``adj @ h`` for a symmetric sparse CSR ``adj [N, N]`` and ``h [N, D]`` (gradient to ``h``
    only, without transposing ``adj``)."""
    return _SymmetricPropagation.apply(adj, h)


def is_symmetric(adj: Tensor) -> bool:
    """Whether the sparse CSR ``adj`` equals its transpose exactly (the same CSR arrays)."""
    transposed = adj.to_sparse_coo().t().coalesce().to_sparse_csr()
    return all(torch.equal(a, b) for a, b in zip(
        (adj.crow_indices(), adj.col_indices(), adj.values()),
        (transposed.crow_indices(), transposed.col_indices(), transposed.values())))
