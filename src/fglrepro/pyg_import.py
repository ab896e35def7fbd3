"""PyG without ``torch._dynamo`` at import time.

PyG 2.x's ``torch_geometric.isinstance`` imports ``torch._dynamo`` (1-2 CPU-seconds, more than half of
``import torch_geometric`` on torch 2.13) only so that ``is_torch_instance`` can see through a
``torch.compile``'d module (``torch._dynamo.OptimizedModule``). A module can only be such a wrapper once
``torch._dynamo`` has been imported, so the same check can look the class up in ``sys.modules`` when it
is called. :func:`install` (run by ``import fglrepro``) puts that equivalent module in place before PyG
is first imported; every training, partition and data process imports PyG, and this pipeline never
compiles.
"""

from __future__ import annotations

import sys
import types

MODULE = "torch_geometric.isinstance"


def is_torch_instance(obj: object, cls: type | tuple[type, ...]) -> bool:
    """``isinstance(obj, cls)``, looking through a ``torch.compile`` wrapper to the module it wraps."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and isinstance(obj, dynamo.OptimizedModule):
        return isinstance(obj._orig_mod, cls)
    return isinstance(obj, cls)


def install() -> None:
    """Register this module's ``is_torch_instance`` as ``torch_geometric.isinstance`` unless PyG (or
    that module) is already imported."""
    if "torch_geometric" in sys.modules or MODULE in sys.modules:
        return
    module = types.ModuleType(MODULE, "is_torch_instance without importing torch._dynamo (fglrepro.pyg_import)")
    module.is_torch_instance = is_torch_instance
    sys.modules[MODULE] = module
