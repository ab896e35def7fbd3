"""Shared CLI plumbing: logging and user-facing errors."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from fglrepro.config import ConfigError


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_cli(body: Callable[[], None]) -> None:
    """Run a CLI body; errors the user can act on print one line and exit with status 2."""
    from fglrepro.data.checksums import ChecksumError
    from fglrepro.io import DamagedFileError

    setup_logging()
    try:
        body()
    except (ConfigError, ChecksumError, DamagedFileError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def subcommand_parser(prog: str, doc: str) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction, Callable]:
    """A ``prog COMMAND`` parser whose description is ``doc``'s first line and whose epilog lists
    the example lines of ``doc`` (lines starting with ``prog``; ``\\``-continued lines joined).
    Returns the parser, its subparsers and ``example(name)``: the keyword arguments giving a
    subparser the examples of subcommand ``name`` as its epilog."""
    examples = ["  " + " ".join(line.split()) for line in doc.replace("\\\n", " ").splitlines()
                if line.strip().startswith(f"{prog} ")]
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0], formatter_class=raw,
                                     epilog=f"examples ({prog} COMMAND --help for its keys):\n" + "\n".join(examples))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def example(name: str) -> dict:
        picked = [line for line in examples if line.startswith(f"  {prog} {name} ")]
        return {"epilog": "example:\n" + "\n".join(picked), "formatter_class": raw}

    return parser, sub, example
