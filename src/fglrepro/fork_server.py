"""Fork server: training and partition jobs start from a process that has imported torch already.

``import torch`` costs a job about 1.1-1.6 CPU seconds on a 2-core VM: most of what a training or
partition job spends beyond its own work (``benchmarks/PARTITION_SPEED.md``), 15 of the 208 CPU-minutes
of the papers'-seeds main tables (682 training jobs). A local workflow run therefore starts one server
(``workflow/rules/hooks.smk``): it imports torch and the training stack once, then forks one child per
job. Each job is still its own Snakemake job with its own command line, log, output and exit status:

    client (``fgl-train ...``: ``src/fglrepro_launcher.py``, no torch)  --argv, cwd, environment, fds-->  server
    server: fork -> child: those fds as 0/1/2, that cwd and environment -> ``fglrepro.cli.train.main()``
    client <--exit status-- server (128 + N when the child died of signal N)

SIGTERM / SIGINT reaching the client go on to the child (a training run stops with its checkpoint kept, as
it does when started directly); a client that dies without a word (SIGKILL) closes its connection, and
the server sends its child SIGTERM. Without a server (the variable :data:`SOCKET` unset, the server not up
yet, another host, ``fgl-train --malloc default``) the client runs the command itself, as before. The
client is a top-level module of its own, outside this package: the console scripts then start with any
source tree of the package first on ``PYTHONPATH`` (``fgl-report verify`` rebuilds runs at older commits so).

The child computes what a fresh process computes (every run seeds its own generators; the server has
drawn no random number and started no thread); ``cpu_s`` and ``wall_s`` of a run JSON count the child
only. Its ``peak_memory_mb`` (the child's maximum resident set) includes the server's pages the child
inherits, as a fresh process's includes its own import of torch. Snakemake's ``benchmark:`` files time
the client: their wall time is the job's, their CPU and memory columns are the client's, not the job's.
Linux only (``fork``, ``SOCK_SEQPACKET``, ``os.pidfd_open``).

    python -m fglrepro.fork_server --socket PATH      # serve until SIGTERM or until its parent is gone
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from fglrepro_launcher import FORWARDED, PROGRAMS, SOCKET, option_values

#: modules the server imports before it serves (what every training job imports; partition jobs add PyG)
PRELOAD = ("torch", "fglrepro.cli.train", "fglrepro.cli.partition", "fglrepro.fl.loop", "fglrepro.fl.engine",
           "fglrepro.fl.checkpoint", "fglrepro.models", "fglrepro.methods", "fglrepro.data.graph",
           "fglrepro.partition.data", "fglrepro.metrics", "fglrepro.provenance")
#: largest request (argv, cwd and environment as JSON)
MAX_REQUEST = 1 << 20


# ---- server ------------------------------------------------------------------------------------

@dataclass(eq=False)
class Job:
    """One client's connection and, once its request arrived, the forked child (``pid``, ``pidfd``)."""

    conn: socket.socket
    pid: int | None = None
    pidfd: int | None = None
    command: str = ""
    started: float = 0.0


def describe(argv: list[str]) -> str:
    """A command line as the server's log names it: the program, its subcommand, its ``--out``."""
    words = argv[:2] if len(argv) > 1 and not argv[1].startswith("-") else argv[:1]
    return " ".join(words + [f"--out {value}" for value in option_values(argv, "--out")])


def exit_status(wait_status: int) -> int:
    """Shell-style exit status of a child: its exit code, or 128 + N when signal N ended it."""
    code = os.waitstatus_to_exitcode(wait_status)
    return code if code >= 0 else 128 - code


def run_child(request: dict, fds: list[int], server_tunables: str | None) -> None:
    """In the forked child: become the requested command (its stdin/stdout/stderr, cwd, environment,
    argv) and exit with its status; never returns."""
    status = 1
    try:
        for signum in (*FORWARDED, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env = dict(request["env"])
        env.pop(SOCKET, None)
        if server_tunables is None:  # the allocator settings this process started with (fglrepro.allocator)
            env.pop("GLIBC_TUNABLES", None)
        else:
            env["GLIBC_TUNABLES"] = server_tunables
        os.environ.clear()
        os.environ.update(env)
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit():  # what torch takes from it when a process starts (the server ran with 1)
            sys.modules["torch"].set_num_threads(int(threads))
        sys.argv = list(request["argv"])
        importlib.import_module(PROGRAMS[request["program"]]).main()
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(status)


class Server:
    """Accepts clients on a Unix socket and forks one child per request; single-threaded (a selector
    over the listening socket, the clients' connections and the children's pidfds), so that no lock
    is held by another thread when it forks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.parent = os.getppid()
        self.selector = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.jobs: set[Job] = set()
        self.stopping = False
        self.wakeup: tuple[socket.socket, socket.socket] = ()

    def serve(self) -> None:
        """Serve until SIGTERM / SIGINT or until the process that started the server is gone, then
        :meth:`close`."""
        def stop(signum, frame):
            self.stopping = True

        wake, waker = self.wakeup = socket.socketpair()  # a signal's byte wakes the select at once
        waker.setblocking(False)
        signal.set_wakeup_fd(waker.fileno())
        self.selector.register(wake, selectors.EVENT_READ)
        for signum in FORWARDED:
            signal.signal(signum, stop)
        while not self.stopping and os.getppid() == self.parent:
            for key, _ in self.selector.select(timeout=1.0):
                if key.fileobj is self.listener:
                    self.accept()
                elif key.fileobj is wake:
                    wake.recv(64)
                else:
                    self.on_event(key.fileobj, key.data)
        self.selector.unregister(wake)
        self.close()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        job = Job(conn)
        self.jobs.add(job)
        self.selector.register(conn, selectors.EVENT_READ, job)

    def on_event(self, fileobj, job: Job) -> None:
        if fileobj is job.conn:
            if job.pid is None:
                self.start(job)
            else:
                self.on_message(job)
        else:
            self.finish(job)

    def start(self, job: Job) -> None:
        """Read the request of ``job``'s client and fork its child."""
        try:
            data, fds, _, _ = socket.recv_fds(job.conn, MAX_REQUEST, 3)
            request = json.loads(data) if data else None
        except (OSError, ValueError):
            request, fds = None, []
        if self.stopping or request is None or len(fds) != 3 or request.get("program") not in PROGRAMS:
            for fd in fds:
                os.close(fd)
            self.drop(job)
            return
        tunables = os.environ.get("GLIBC_TUNABLES")
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            for sock in (self.listener, *self.wakeup):
                sock.close()
            self.selector.close()
            for other in self.jobs:
                other.conn.close()
                if other.pidfd is not None:
                    os.close(other.pidfd)
            run_child(request, fds, tunables)
        for fd in fds:
            os.close(fd)
        job.pid, job.pidfd = pid, os.pidfd_open(pid)
        job.command, job.started = describe(request["argv"]), time.monotonic()
        self.selector.register(job.pidfd, selectors.EVENT_READ, job)

    def on_message(self, job: Job) -> None:
        """A signal to pass on, or the client gone (end of stream): its child gets SIGTERM."""
        try:
            message = job.conn.recv(4096)
        except OSError:
            message = b""
        if not message:
            self.hang_up(job)
            signal.pidfd_send_signal(job.pidfd, signal.SIGTERM)
            return
        signum = json.loads(message).get("signal")
        if signum in FORWARDED:
            signal.pidfd_send_signal(job.pidfd, signum)

    def finish(self, job: Job) -> None:
        """``job``'s child ended: reap it and send its exit status to the client (if still there)."""
        _, wait_status = os.waitpid(job.pid, 0)
        self.selector.unregister(job.pidfd)
        os.close(job.pidfd)
        status = exit_status(wait_status)
        print(f"pid {job.pid}: {job.command}: exit status {status} after {time.monotonic() - job.started:.1f} s",
              flush=True)
        if job.conn.fileno() >= 0:
            try:
                job.conn.send(json.dumps({"status": status}).encode())
            except OSError:
                pass
        self.drop(job)

    def hang_up(self, job: Job) -> None:
        """Close ``job``'s connection (if still open)."""
        if job.conn.fileno() >= 0:
            self.selector.unregister(job.conn)
            job.conn.close()

    def drop(self, job: Job) -> None:
        """Forget ``job``: its child ended, or its client sent no valid request (or came while stopping)."""
        self.hang_up(job)
        self.jobs.discard(job)

    def close(self, grace_s: float = 30.0) -> None:
        """Stop serving; wait up to ``grace_s`` for the running children (a training job started by the
        workflow stops by itself once Snakemake is gone), then send the rest SIGTERM and wait for them."""
        self.selector.unregister(self.listener)
        self.listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        deadline = time.monotonic() + grace_s
        while self.running() and time.monotonic() < deadline:
            for key, _ in self.selector.select(timeout=max(0.0, deadline - time.monotonic())):
                self.on_event(key.fileobj, key.data)
        for job in self.running():
            signal.pidfd_send_signal(job.pidfd, signal.SIGTERM)
            self.finish(job)
        for job in list(self.jobs):
            self.drop(job)
        self.selector.close()

    def running(self) -> list[Job]:
        return [job for job in self.jobs if job.pid is not None]


# ---- workflow side -----------------------------------------------------------------------------

def start(log_path: str, timeout_s: float = 30.0) -> subprocess.Popen | None:
    """Start a server in a session of its own (a terminal's Ctrl-C reaches the jobs through their clients,
    not the server) on a socket in a new temporary folder, appending to the log ``log_path``; wait up to
    ``timeout_s`` until it serves and point :data:`SOCKET` of this process (so of every job it starts
    later) at it. Returns the server's process, or None where fork servers are not available (not Linux)."""
    if not hasattr(os, "pidfd_open"):
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="fglrepro-fork-"), "socket")
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "a") as log:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env.pop(SOCKET, None)
        server = subprocess.Popen([sys.executable, "-m", "fglrepro.fork_server", "--socket", path],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.environ[SOCKET] = path
    return server


def stop(server: subprocess.Popen | None, timeout_s: float = 60.0) -> None:
    """Stop a server of :func:`start` (SIGTERM; SIGKILL after ``timeout_s``) and remove its folder."""
    path = os.environ.pop(SOCKET, None)
    if server is None:
        return
    server.terminate()
    try:
        server.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    if path:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fglrepro.fork_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="path of the Unix socket to serve on (must not exist)")
    args = parser.parse_args(argv)
    from fglrepro.allocator import restart_keeping_freed_memory

    restart_keeping_freed_memory()  # children inherit the allocator settings fgl-train restarts with
    started = time.monotonic()
    for module in PRELOAD:
        importlib.import_module(module)
    server = Server(args.socket)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} serving on {args.socket} (pid {os.getpid()}; imports took "
          f"{time.monotonic() - started:.1f} s)", flush=True)
    server.serve()  # the socket appears once the imports are done: clients before it run alone


if __name__ == "__main__":
    main()
