"""Atomic file output (temp file + rename), so an interrupted job leaves no partial file, and the one
YAML reader of the project (duplicate keys are an error)."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml


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


def atomic_torch_save(obj: Any, path: str | Path, pickle_module: Any = pickle) -> None:
    """``torch.save`` to ``path`` atomically (with ``pickle_module``'s ``Pickler``)."""
    import torch

    _atomic_write(path, lambda tmp: torch.save(obj, tmp, pickle_module=pickle_module))


def atomic_write_text(text: str, path: str | Path) -> None:
    """Write a text file atomically."""
    _atomic_write(path, lambda tmp: Path(tmp).write_text(text))


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping key given twice (PyYAML keeps the last silently); keys merged
    in with ``<<: *anchor`` may still be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (lines {seen[key]} and {line})", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse YAML ``text`` like ``yaml.safe_load``, but a key repeated in one mapping raises
    ``yaml.YAMLError`` naming the key and both lines."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml(path: str | Path) -> Any:
    """``load_yaml`` of the file ``path``."""
    return load_yaml(Path(path).read_text())


class DamagedFileError(RuntimeError):
    """A workflow artefact exists but cannot be read (truncated or corrupted)."""


def damaged_message(path: str | Path, rule: str, err: BaseException) -> str:
    """What a user sees for a damaged artefact: the file, the rule that makes it and the command that rebuilds it
    (Snakemake's ``-R FILE`` reruns that file's job and everything downstream of it; no other output is touched)."""
    return (f"damaged file {path} ({type(err).__name__}: {err}); it is made by rule {rule}. "
            f"Rebuild it with: snakemake --cores all -R '{path}'")


def archive_problem(path: str | Path) -> Exception | None:
    """Why the torch file ``path`` (a zip archive, as ``torch.save`` writes it) is damaged, checked
    without torch: not a readable archive (truncated) or a member whose CRC-32 does not match;
    ``None`` when intact."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return err
    return None if bad is None else zipfile.BadZipFile(f"member {bad} fails its CRC-32 check")


def load_torch(path: str | Path, rule: str) -> Any:
    """``torch.load(path, weights_only=True)`` raising :class:`DamagedFileError` (naming ``path`` and the
    producing ``rule``) for a truncated or corrupted file; a missing file stays ``FileNotFoundError``."""
    import torch

    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        raise DamagedFileError(damaged_message(path, rule, err)) from None


def read_json(path: str | Path, rule: str) -> Any:
    """``json.loads`` of the file ``path``, raising :class:`DamagedFileError` for a truncated or corrupted one."""
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DamagedFileError(damaged_message(path, rule, err)) from None
