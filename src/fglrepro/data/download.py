"""Verified acquisition of raw dataset files: a mirror first, the official loader otherwise."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from fglrepro.config import ConfigError
from fglrepro.data.checksums import ChecksumError, read_sums, sha256, verify
from fglrepro.data.registry import DatasetSpec, load_with_loader

log = logging.getLogger(__name__)

PINNED_SUMS = Path(__file__).with_name("pinned_sha256sums.txt")

Mirrors = str | Path | Sequence[str | Path] | None


def pinned_checksums() -> dict[str, str]:
    """SHA-256 of official raw files known to the project (file name -> digest)."""
    return read_sums(PINNED_SUMS)


def mirror_roots(mirror: Mirrors) -> list[Path]:
    """The config key ``mirror`` (``null``, one directory or a list of them) as a list of paths."""
    if mirror is None:
        return []
    if isinstance(mirror, (str, Path)):
        return [Path(mirror)] if str(mirror) else []
    return [Path(root) for root in mirror]


def mirror_folders(spec: DatasetSpec, mirror: Mirrors) -> list[Path]:
    """Folders that may hold ``spec``'s raw files, in search order: for each mirror root its
    subfolder ``spec.mirror_subdir`` (the layout of ``../shared/datasets``: ``planetoid/``,
    ``amazon/``, ``coauthor/``, ``actor/``), then the root itself (a folder of raw files, such as
    ``resources/datasets/planetoid``)."""
    return [folder for root in mirror_roots(mirror) for folder in (root / spec.mirror_subdir, root)]


def missing_files(spec: DatasetSpec, folder: Path) -> list[str]:
    """``spec``'s raw files that ``folder`` lacks, in ``spec.raw_files`` order."""
    return [name for name in spec.raw_files if not (folder / name).is_file()]


def find_mirror(spec: DatasetSpec, mirror: Mirrors) -> Path | None:
    """The first of :func:`mirror_folders` that holds all of ``spec``'s raw files, else ``None``."""
    return next((folder for folder in mirror_folders(spec, mirror) if not missing_files(spec, folder)), None)


def mirror_arguments(spec: DatasetSpec, mirror: Mirrors) -> list[str]:
    """``fgl-data download`` arguments for the config key ``mirror``: ``--mirror <folder>`` for the
    folder holding all of ``spec``'s raw files (the same arguments whether ``mirror`` names that
    folder or a root above it, so a changed key reruns no download), else every root."""
    found = find_mirror(spec, mirror)
    roots = [found] if found is not None else mirror_roots(mirror)
    return [arg for root in roots for arg in ("--mirror", str(root))]


def copy_verified(spec: DatasetSpec, folder: Path, raw_dir: Path, pinned: dict[str, str]) -> None:
    """Copy ``spec``'s raw files from the mirror ``folder`` to ``raw_dir``, each checked against its
    pinned digest, else the one in ``folder/SHA256SUMS``; a mismatch removes the copy and raises
    :class:`ChecksumError`."""
    sums_file = folder / "SHA256SUMS"
    mirror_sums = read_sums(sums_file) if sums_file.is_file() else {}
    for name in spec.raw_files:
        expected = pinned.get(name) or mirror_sums.get(name)
        if expected is None:
            raise ChecksumError(f"no checksum known for mirror file {folder / name}: neither {PINNED_SUMS} "
                                f"nor {sums_file} lists it")
        partial = raw_dir / f"{name}.part"
        shutil.copyfile(folder / name, partial)
        try:
            verify(partial, expected, source=folder / name, sums_file=PINNED_SUMS if name in pinned else sums_file)
        except ChecksumError:
            partial.unlink()
            raise
        partial.replace(raw_dir / name)


def fetch_raw(spec: DatasetSpec, raw_root: str | Path, mirror: Mirrors) -> dict:
    """Place ``spec``'s raw files under ``raw_root`` in the loader's layout, verified.

    ``mirror`` is ``None``, a directory or a list of them: mirror roots laid out as
    ``../shared/datasets`` (one subfolder per loader) or folders of raw files. From the first
    folder of :func:`mirror_folders` that holds every raw file they are copied; otherwise the
    official loader downloads them. Each file is checked against the pinned checksum (or, for
    a file of a mirror that the package does not pin, the mirror's ``SHA256SUMS``); a mismatch
    deletes the file and raises :class:`ChecksumError`. The loader's processed cache is built
    here too, so that later jobs only read it.

    Returns a record ``{"dataset", "source", "files": {name: sha256}, "pinned": bool}``.
    """
    raw_dir = Path(raw_root) / spec.raw_subdir
    raw_dir.mkdir(parents=True, exist_ok=True)
    pinned = pinned_checksums()
    folder = find_mirror(spec, mirror)
    if folder is not None:
        copy_verified(spec, folder, raw_dir, pinned)
        source = f"mirror:{folder}"
    else:
        log.info("downloading %s through its official loader (no mirror folder holds all its raw files)", spec.name)
        source = "download"
    # The loader downloads what is missing and builds its processed cache now, once, so that
    # later jobs (several preprocessing variants may run concurrently) only read it.
    try:
        load_with_loader(spec, str(raw_root))
    except Exception as err:
        if not is_connection_error(err):
            raise
        raise ConfigError(offline_message(spec, raw_dir, mirror, err)) from None
    if source == "download":
        for name in spec.raw_files:
            if name in pinned:
                try:
                    verify(raw_dir / name, pinned[name], sums_file=PINNED_SUMS)
                except ChecksumError:
                    (raw_dir / name).unlink()
                    shutil.rmtree(raw_dir.parent / "processed", ignore_errors=True)
                    raise
    files = {name: sha256(raw_dir / name) for name in spec.raw_files}
    unpinned = sorted(set(files) - set(pinned))
    if unpinned:
        log.warning("no pinned checksum for %s; recorded digests on first use", unpinned)
    return {"dataset": spec.name, "source": source, "files": files, "pinned": not unpinned}


def is_connection_error(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a failed network connection."""
    import socket
    import urllib.error

    classes: tuple[type[BaseException], ...] = (ConnectionError, socket.gaierror, TimeoutError, urllib.error.URLError)
    try:
        import aiohttp

        classes += (aiohttp.ClientConnectionError,)
    except ImportError:
        pass
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, classes):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def offline_message(spec: DatasetSpec, raw_dir: Path, mirror: Mirrors, err: BaseException) -> str:
    """A few lines telling a user without network which raw files of ``spec`` each searched mirror
    folder lacks and which config key points the workflow at a mirror."""
    searched = [
        f"  {folder}: " + ("no such folder" if not folder.is_dir() else f"missing {missing_files(spec, folder)}")
        for folder in mirror_folders(spec, mirror)
    ]
    where = "\n".join(["Mirror folders searched:", *searched]) if searched else "No mirror is set."
    return (f"no network: downloading {spec.name} failed ({type(err).__name__}: {err}).\n{where}\n"
            f"Put the raw files {list(spec.raw_files)} in {raw_dir} or in <root>/{spec.mirror_subdir}/ "
            "(with a SHA256SUMS for files the package does not pin), or set mirror: <root> (a directory or a list "
            "of them) in config/config.yaml (or --config mirror=<root>) to a mirror that holds them.")


def verify_recorded(spec: DatasetSpec, raw_root: str | Path, record_path: str | Path) -> None:
    """Re-check ``spec``'s raw files against the digests recorded at download (``record_path``,
    written by ``fetch_raw``); raise :class:`ChecksumError` naming the file, both digests and how to restore it."""
    import json

    raw_dir = Path(raw_root) / spec.raw_subdir
    recorded = json.loads(Path(record_path).read_text())["files"]
    for name, digest in recorded.items():
        actual = sha256(raw_dir / name)
        if actual != digest:
            raise ChecksumError(
                f"raw file {raw_dir / name} changed since its verified download: sha256 {digest} recorded in "
                f"{record_path}, now {actual}. Restore it: delete {raw_dir / name} and {record_path} "
                "and rerun snakemake (the download rule fetches and verifies it again)")
