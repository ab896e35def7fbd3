"""The console scripts ``fgl-train`` and ``fgl-partition``: run the command in the workflow's fork server
when one serves this process (``src/fglrepro/fork_server.py``), else here.

A top-level module of its own, not part of the ``fglrepro`` package, so that the console scripts start
whichever source tree of the package comes first on ``PYTHONPATH`` (also trees from before the fork
server, as ``fgl-report verify`` uses them). Standard library only: a client imports no torch.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys

#: environment variable naming the fork server's socket (set by the workflow for its jobs)
SOCKET = "FGLREPRO_FORK_SERVER"
#: programs the fork server runs: name -> module whose ``main()`` is the program
PROGRAMS = {"fgl-train": "fglrepro.cli.train", "fgl-partition": "fglrepro.cli.partition"}
#: signals a client passes on to its job
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def connect() -> socket.socket | None:
    """A connection to the server named by :data:`SOCKET`, or None (unset, not up, not reachable)."""
    path = os.environ.get(SOCKET)
    if not path or not hasattr(os, "pidfd_open"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def run_in_server(sock: socket.socket, program: str, args: list[str]) -> int:
    """Have the server run ``program args`` with this process's cwd, environment and stdin/stdout/stderr;
    returns its exit status. SIGTERM / SIGINT received meanwhile are passed on to the job."""
    request = {"program": program, "argv": [program, *args], "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])

    def forward(signum, frame):
        sock.send(json.dumps({"signal": signum}).encode())

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        reply = sock.recv(4096)  # a signal handled meanwhile does not interrupt it (PEP 475)
    except ConnectionError:
        reply = b""
    if not reply:
        print(f"{program}: the fork server closed the connection before the job ended", file=sys.stderr)
        return 1
    return int(json.loads(reply)["status"])


def option_values(args: list[str], name: str) -> list[str]:
    """Values of option ``name`` (``--malloc``) in ``args``, as ``name value`` or ``name=value``."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return values + [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def launch(program: str) -> None:
    """Run ``program`` with this process's arguments in the fork server, or here without one.
    ``fgl-train --malloc default`` always runs here: a forked job has the server's allocator settings."""
    args = sys.argv[1:]
    sock = None if program == "fgl-train" and "default" in option_values(args, "--malloc") else connect()
    if sock is None:
        importlib.import_module(PROGRAMS[program]).main()
        return
    with sock:
        sys.exit(run_in_server(sock, program, args))


def train() -> None:
    """``fgl-train``."""
    launch("fgl-train")


def partition() -> None:
    """``fgl-partition``."""
    launch("fgl-partition")
