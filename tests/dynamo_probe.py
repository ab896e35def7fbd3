"""Run by tests/test_kernel_optimizer.py in a fresh process, given the folder of conftest's
``cli_inputs``: every training row of tests/test_cuda.py's ``SPECS`` (the five main tables and a row
of every other method) for its two short rounds, with ``import torch._dynamo`` refused. Prints one
line per row that asked for it (the row and the fglrepro / torch.optim frames that asked) and nothing
else: importing ``torch._dynamo`` costs about a second of CPU per training process
(:class:`~fglrepro.fl.kernel_optimizer.KernelOptimizer`)."""

from __future__ import annotations

import importlib.abc
import sys
import tempfile
import traceback
from pathlib import Path

#: (row, the asking frames) per refused import
REFUSED: list[tuple[str, list[str]]] = []
ROW = ["imports"]


class RefuseDynamo(importlib.abc.MetaPathFinder):
    """Refuses ``torch._dynamo`` and records which row's code asked for it."""

    def find_spec(self, name, path, target=None):
        if name == "torch._dynamo":
            frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                      if "fglrepro" in f.filename or "torch/optim" in f.filename]
            REFUSED.append((ROW[0], frames[-4:]))
            raise ImportError("torch._dynamo refused by tests/dynamo_probe.py")
        return None


def main() -> None:
    sys.meta_path.insert(0, RefuseDynamo())
    import torch

    import fglrepro.data.graph  # noqa: F401  (PyG through fglrepro's import shim, before conftest's PyG)

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cuda import SPECS

    from fglrepro.cli.train import execute
    from fglrepro.data.graph import load_graph
    from fglrepro.partition.build import PartitionSpec, build_partition

    torch.set_num_threads(1)
    inputs = Path(sys.argv[1])  # conftest's cli_inputs: g.pt and its partition p.pt
    graphless = Path(tempfile.mkdtemp()) / "graphless.pt"  # FedGLS: one of the 3 clients graphless
    spec = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=0.34)
    build_partition(load_graph(inputs / "g.pt"), spec, 3, seed=0).save(graphless)
    for row, spec in sorted(SPECS.items()):
        ROW[0] = row
        partition = graphless if spec["method"] == "fedgls" else inputs / "p.pt"
        try:
            execute(spec, str(inputs / "g.pt"), str(partition), "cpu")
        except ImportError:  # the refusal, recorded above
            pass
    for row, frames in REFUSED:
        print(row, frames)


if __name__ == "__main__":
    main()
