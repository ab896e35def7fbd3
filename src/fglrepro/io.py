"""Atomic file output (temp file + rename), so an interrupted job leaves no partial file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _atomic_write(path: str | Path, write: Callable[[str], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(obj: Any, path: str | Path) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            json.dump(obj, handle, indent=1, sort_keys=False)
            handle.write("\n")

    _atomic_write(path, write)


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` atomically."""
    import torch

    _atomic_write(path, lambda tmp: torch.save(obj, tmp))


def atomic_write_text(text: str, path: str | Path) -> None:
    """Write a text file atomically."""
    _atomic_write(path, lambda tmp: Path(tmp).write_text(text))
