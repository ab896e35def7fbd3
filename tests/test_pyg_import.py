"""PyG imported through fglrepro does not import torch._dynamo, and is_torch_instance still sees
through torch.compile wrappers."""

import subprocess
import sys

SCRIPT = """
import sys
import fglrepro
import torch
from torch_geometric.nn import GCNConv
from torch_geometric.isinstance import is_torch_instance
assert "torch._dynamo" not in sys.modules, "PyG imported torch._dynamo"
conv = GCNConv(3, 2)
assert is_torch_instance(conv, GCNConv) and not is_torch_instance(conv, torch.nn.Linear)
compiled = torch.compile(conv)
assert type(compiled).__name__ == "OptimizedModule"
assert is_torch_instance(compiled, GCNConv) and not isinstance(compiled, GCNConv)
print("ok")
"""


def test_pyg_without_dynamo_and_compiled_modules_unwrapped():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_an_already_imported_pyg_is_left_alone():
    script = "import sys, torch_geometric, fglrepro; print(type(sys.modules['torch_geometric.isinstance'].__spec__))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ModuleSpec" in proc.stdout, proc.stderr[-2000:]
