"""Per-job overhead: the CPU a partition job and a training job spend beyond their real work.

    .venv/bin/python benchmarks/job_overhead.py --data data/prepared/Cora/plain.pt [--repeats 5]
        [--src NAME=path/to/src ...]

For each source tree (measured interleaved, one repetition of each after the other), the CPU
seconds (user + system) of: ``python -c "import torch"`` (the floor of every job);
``fgl-partition build`` (Louvain, delta 20, stratified 20/40/40, Cora-10) and its real work
(``build_partition`` timed inside a warm process); ``fgl-train`` (FedAvg, 100 rounds x 3 local
epochs, on the partition just built) and its real work (the round loop, ``cpu_s`` of the run
JSON). Prints the medians and overhead = process - real work. ``--fork-server`` adds both jobs started as the
workflow starts them by default (``src/fglrepro/fork_server.py``: the client, and the child forked from a
server of the current tree; its CPU read from the server's reaped-children times).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTITION = {"partitioner": "louvain", "options": {"delta": 20},
             "split": {"mode": "stratified", "train": 0.2, "val": 0.4}}
SPEC = {"seed": 0, "method": "fedavg", "hparams": {},
        "model": {"arch": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5},
        "train": {"rounds": 100, "local_epochs": 3, "optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4},
        "evaluation": {"model": "global", "average": "weighted"}}
#: ``build_partition`` once to warm up (imports), then timed
PARTITION_WORK = (
    "import json, sys, time; from fglrepro.data.graph import load_graph; "
    "from fglrepro.partition.build import PartitionSpec, build_partition; graph = load_graph(sys.argv[1]); "
    "spec = PartitionSpec.from_dict(json.loads(sys.argv[2])); build_partition(graph, spec, 10, 1); "
    "start = time.process_time(); build_partition(graph, spec, 10, 0); print(time.process_time() - start)")


def child(cmd: list[str], src: str) -> tuple[float, str]:
    """CPU seconds (user + system) and stdout of ``cmd`` run on the package at ``src``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out.stdout


def reaped_cpu(pid: int) -> float:
    """CPU seconds of the reaped children of process ``pid`` (``cutime + cstime`` of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def forked(cmd: list[str], server: int) -> float:
    """CPU seconds of ``cmd`` run through the fork server ``server`` (of this checkout's src): its client and
    the forked child."""
    before = reaped_cpu(server)
    client = child(cmd, str(REPO / "src"))[0]
    return client + reaped_cpu(server) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="prepared Cora graph (.pt)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--src", nargs="+", default=[f"current={REPO / 'src'}"], help="NAME=PATH source trees")
    parser.add_argument("--fork-server", action="store_true",
                        help="also both jobs through a fork server of this checkout's src")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.src)
    python = sys.executable
    samples = {name: {key: [] for key in ("torch", "partition", "partition_work", "train", "train_work")}
               for name in trees}
    fork = {"partition": [], "train": [], "train_work": []}
    with tempfile.TemporaryDirectory() as tmp:
        part, run = Path(tmp) / "part.pt", Path(tmp) / "run.json"
        server = None
        if args.fork_server:
            os.environ["PYTHONPATH"] = str(REPO / "src")
            from fglrepro import fork_server

            server = fork_server.start(str(Path(tmp) / "fork_server.log"))
            client = "import sys; import fglrepro_launcher; fglrepro_launcher.launch(sys.argv.pop(1))"
        for _ in range(args.repeats):
            if server is not None:
                fork["partition"].append(forked([python, "-c", client, "fgl-partition", "build", "--data", args.data,
                                                  "--spec", json.dumps(PARTITION), "--clients", "10", "--seed", "0",
                                                  "--out", str(part)], server.pid))
                fork["train"].append(forked([python, "-c", client, "fgl-train", "--spec", json.dumps(SPEC), "--data",
                                              args.data, "--partition", str(part), "--out", str(run), "--threads", "1",
                                              "--device", "cpu"], server.pid))
                fork["train_work"].append(json.loads(run.read_text())["cpu_s"])
            for name, src in trees.items():
                s = samples[name]
                s["torch"].append(child([python, "-c", "import torch"], src)[0])
                s["partition"].append(child([python, "-m", "fglrepro.cli.partition", "build", "--data", args.data,
                                             "--spec", json.dumps(PARTITION), "--clients", "10", "--seed", "0",
                                             "--out", str(part)], src)[0])
                s["partition_work"].append(float(child([python, "-c", PARTITION_WORK, args.data,
                                                        json.dumps(PARTITION)], src)[1]))
                s["train"].append(child([python, "-m", "fglrepro.cli.train", "--spec", json.dumps(SPEC), "--data",
                                         args.data, "--partition", str(part), "--out", str(run), "--threads", "1",
                                         "--device", "cpu"], src)[0])
                s["train_work"].append(json.loads(run.read_text())["cpu_s"])
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}, CPU seconds")
    for name, s in samples.items():
        med = {key: statistics.median(values) for key, values in s.items()}
        print(f"{name}: import torch {med['torch']:.2f}; partition job {med['partition']:.2f} (work "
              f"{med['partition_work']:.2f}, overhead {med['partition'] - med['partition_work']:.2f}); training "
              f"job {med['train']:.2f} (loop {med['train_work']:.2f}, overhead {med['train'] - med['train_work']:.2f})")
    if server is not None:
        fork_server.stop(server)
        med = {key: statistics.median(values) for key, values in fork.items()}
        work = statistics.median(samples["current"]["partition_work"]) if "current" in samples else 0.0
        print(f"fork server (current): partition job {med['partition']:.2f} (overhead {med['partition'] - work:.2f}); "
              f"training job {med['train']:.2f} (loop {med['train_work']:.2f}, overhead "
              f"{med['train'] - med['train_work']:.2f})")


if __name__ == "__main__":
    main()
