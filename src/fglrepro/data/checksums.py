"""SHA-256 verification of raw dataset files."""

from __future__ import annotations

import hashlib
from pathlib import Path


class ChecksumError(RuntimeError):
    """A raw file does not match its expected SHA-256; the file must not be used."""


def sha256(path: str | Path) -> str:
    """Hex SHA-256 digest of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_sums(path: str | Path) -> dict[str, str]:
    """Parse a ``sha256sum``-format file into ``{file name: digest}``."""
    sums = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*").strip()] = digest.lower()
    return sums


def verify(path: str | Path, expected: str, source: str | Path | None = None,
           sums_file: str | Path | None = None) -> None:
    """Raise ChecksumError if ``path``'s digest differs from ``expected``; the message names
    the file the data came from (``source``, default ``path``), the file the expected digest
    was read from (``sums_file``), and both digests."""
    actual = sha256(path)
    if actual != expected.lower():
        origin = f"{source} (checked as {path})" if source is not None and Path(source) != Path(path) else path
        listed = f" (listed in {sums_file})" if sums_file is not None else ""
        raise ChecksumError(f"checksum mismatch for {origin}: expected sha256 {expected.lower()}{listed}, "
                            f"got {actual}; the file was deleted, replace it or fix the digest")
