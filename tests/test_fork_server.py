"""The fork server (src/fglrepro/fork_server.py): a job forked from it computes what a fresh process
computes, and exit status, error messages and stop signals reach the client as they would the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_robustness import wait_for

from fglrepro import fork_server
from fglrepro.processes import process_alive
from fglrepro_launcher import SOCKET

BIN = Path(sys.executable).parent
SPEC = {"method": "fedavg", "seed": 0, "train": {"rounds": 4, "local_epochs": 1}, "model": {"hidden": 16}}


@pytest.fixture
def server(tmp_path):
    """A running fork server (this process's :data:`SOCKET` points at it) and its log."""
    log = tmp_path / "fork_server.log"
    process = fork_server.start(str(log))
    assert process is not None and process.poll() is None, log.read_text()
    yield process, log
    fork_server.stop(process)


def train_command(inputs: Path, out: Path, spec: dict = SPEC, *extra: str) -> list[str]:
    return [str(BIN / "fgl-train"), "--spec", json.dumps(spec), "--data", str(inputs / "g.pt"), "--partition",
            str(inputs / "p.pt"), "--out", str(out), "--threads", "1", *extra]


def run(command: list[str], via: str | None, log: Path) -> int:
    """Run ``command`` with its output in ``log``, through the server at ``via`` (None: without one)."""
    env = {k: v for k, v in os.environ.items() if k != SOCKET}
    if via:
        env[SOCKET] = via
    with open(log, "w") as handle:
        return subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=300).returncode


def served(server_log: Path, out: Path) -> list[str]:
    """The server's log lines of the job writing ``out``."""
    return [line for line in server_log.read_text().splitlines() if f"--out {out}" in line]


def test_a_forked_training_job_computes_what_a_fresh_process_computes(server, cli_inputs, tmp_path):
    _, server_log = server
    fresh, forked = tmp_path / "fresh.json", tmp_path / "forked.json"
    assert run(train_command(cli_inputs, fresh), None, tmp_path / "fresh.log") == 0
    assert run(train_command(cli_inputs, forked), os.environ[SOCKET], tmp_path / "forked.log") == 0
    assert served(server_log, fresh) == []
    (line,) = served(server_log, forked)
    assert "fgl-train --out" in line and "exit status 0" in line
    a, b = json.loads(fresh.read_text()), json.loads(forked.read_text())
    assert a["metrics"] == b["metrics"] and a["curves"] == b["curves"] and b["status"] == "ok"
    assert a["malloc"] == b["malloc"] == "reuse"  # the server runs with the allocator settings of fgl-train
    assert "done in" in (tmp_path / "forked.log").read_text()  # the job's log lines reach the client's stderr


def test_a_forked_partition_job_writes_the_partition_a_fresh_process_writes(server, cli_inputs, tmp_path):
    _, server_log = server
    spec = json.dumps({"partitioner": "louvain", "options": {}, "split": {"mode": "stratified", "train": 0.2,
                                                                          "val": 0.4}})
    outs = {}
    for name, via in (("fresh", None), ("forked", os.environ[SOCKET])):
        outs[name] = tmp_path / f"{name}.pt"
        command = [str(BIN / "fgl-partition"), "build", "--data", str(cli_inputs / "g.pt"), "--spec", spec,
                   "--clients", "3", "--seed", "1", "--out", str(outs[name])]
        assert run(command, via, tmp_path / f"{name}.log") == 0
    (line,) = served(server_log, outs["forked"])
    assert "fgl-partition build --out" in line
    from fglrepro.partition.data import Partition

    a, b = Partition.load(outs["fresh"]), Partition.load(outs["forked"])
    assert all(torch.equal(x, y) for x, y in zip(a.client_nodes, b.client_nodes)) and len(a.client_nodes) == 3


def test_exit_status_and_error_message_reach_the_client(server, cli_inputs, tmp_path):
    _, server_log = server
    out = tmp_path / "bad.json"
    command = train_command(cli_inputs, out)
    command[command.index("--spec") + 1] = "{not json"
    assert run(command, os.environ[SOCKET], tmp_path / "bad.log") == 2
    assert "error: --spec is not valid JSON" in (tmp_path / "bad.log").read_text()
    (line,) = served(server_log, out)
    assert "exit status 2" in line


def test_malloc_default_runs_outside_the_server(server, cli_inputs, tmp_path):
    _, server_log = server
    out = tmp_path / "plain.json"
    assert run(train_command(cli_inputs, out, SPEC, "--malloc", "default"), os.environ[SOCKET], tmp_path / "l") == 0
    assert json.loads(out.read_text())["malloc"] == "default" and served(server_log, out) == []


def test_without_a_reachable_server_the_client_runs_the_job_itself(cli_inputs, tmp_path):
    out = tmp_path / "alone.json"
    assert run(train_command(cli_inputs, out), str(tmp_path / "no-such-socket"), tmp_path / "alone.log") == 0
    assert json.loads(out.read_text())["status"] == "ok"


def start_long_job(cli_inputs: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """A 100,000-round job through the server: ``(client, its log, its --out)`` once it has started."""
    out, log = tmp_path / "long.json", tmp_path / "long.log"
    spec = {**SPEC, "train": {"rounds": 100000, "local_epochs": 1}}
    with open(log, "w") as handle:
        client = subprocess.Popen(train_command(cli_inputs, out, spec, "--checkpoint-every", "-1"), stdout=handle,
                                  stderr=subprocess.STDOUT)
    wait_for(lambda: "start:" in log.read_text() or client.poll() is not None, 120, "the job's start")
    assert client.poll() is None, log.read_text()
    return client, log, out


def wait_for_line(server_log: Path, out: Path) -> str:
    """The server's log line of the job writing ``out``, once it is there (within 60 s)."""
    wait_for(lambda: served(server_log, out), 60, f"the server's line of {out}")
    return served(server_log, out)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_client_stops_the_job_as_it_stops_a_fresh_process(server, cli_inputs, tmp_path, sig):
    _, server_log = server
    client, log, out = start_long_job(cli_inputs, tmp_path)
    client.send_signal(sig)
    assert client.wait(timeout=60) == 128 + sig
    assert f"stopped by {sig.name}" in log.read_text()
    assert f"exit status {128 + sig}" in wait_for_line(server_log, out)


def test_a_killed_client_gets_its_job_stopped(server, cli_inputs, tmp_path):
    _, server_log = server
    client, log, out = start_long_job(cli_inputs, tmp_path)
    client.kill()
    client.wait()
    assert "exit status 143" in wait_for_line(server_log, out)  # SIGTERM from the server
    assert "stopped by SIGTERM" in log.read_text()


def test_stop_ends_the_server_and_removes_its_socket(tmp_path):
    process = fork_server.start(str(tmp_path / "fork_server.log"))
    path = os.environ[SOCKET]
    assert Path(path).exists()
    fork_server.stop(process)
    assert process.returncode == 0 and SOCKET not in os.environ and not Path(path).parent.exists()


def test_the_server_leaves_when_the_process_that_started_it_is_gone(tmp_path):
    """A SIGKILLed Snakemake runs no onerror hook: the server notices its parent is gone and exits."""
    starter = (f"import sys; sys.path[:0] = {sys.path!r}; from fglrepro import fork_server; "
               f"p = fork_server.start({str(tmp_path / 'log')!r}); print(p.pid, flush=True); "
               "import time; time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    wait_for(lambda: not process_alive(server_pid), 30, "the server to leave after its parent")
