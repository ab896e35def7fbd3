"""Workflow progress lines (:mod:`fglrepro.progress`): counts, CPU so far, and the time left
estimated per method from the finished runs."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time

from fglrepro.fl.loop import RoundProgress
from fglrepro.fl.ticker import Ticker
from fglrepro.progress import (
    Progress,
    cancel_rescheduling_timers,
    damaged_runs_message,
    duration,
    start,
    stored_costs,
)


def finish(path, method, cpu_s):
    path.write_text(json.dumps({"method": method, "cpu_s": cpu_s, "wall_s": cpu_s + 1}))


def test_the_estimate_uses_each_method_s_median_and_names_the_methods_not_timed_yet(tmp_path):
    runs = {name: tmp_path / f"{name}.json" for name in "abcde"}
    finish(runs["a"], "fedavg", 5.0)  # an outdated run the workflow redoes: there, but older than the start
    os.utime(runs["a"], (time.time() - 3600, time.time() - 3600))
    methods = {"a": "fedavg", "b": "fedavg", "c": "fedavg", "d": "fedsage_plus", "e": "fedsage_plus"}
    progress = Progress([(runs[n], m) for n, m in methods.items()], workers=2)

    progress.update()
    assert progress.line() == ("progress: 0 of 5 training runs done (0 %), 0.0 CPU-min so far "
                               "(not counted: 5 runs of fedavg, fedsage_plus, not timed yet)")
    finish(runs["b"], "fedavg", 120.0)
    runs["d"].write_text('{"method": "fedsage_plus", "cpu')  # being written: not finished
    progress.update()
    assert progress.line() == ("progress: 1 of 5 training runs done (20 %), 2.0 CPU-min so far; about 2 min "
                               "left at 2 at a time (not counted: 2 runs of fedsage_plus, not timed yet)")
    finish(runs["d"], "fedsage_plus", 600.0)
    progress.update()
    assert progress.line() == ("progress: 2 of 5 training runs done (40 %), 12.0 CPU-min so far; "
                               "about 7 min left at 2 at a time")
    finish(runs["a"], "fedavg", 60.0)  # its job replaced it
    finish(runs["c"], "fedavg", 60.0)
    finish(runs["e"], "fedsage_plus", 660.0)
    progress.update()
    assert progress.line() == "progress: 5 of 5 training runs done (100 %), 25.0 CPU-min so far"


def test_runs_of_methods_not_timed_yet_count_with_the_snapshot_s_time_of_the_same_job(tmp_path):
    """A run counts with the stored run of the same job (matched from the study on, whatever the results
    folder); a run the snapshot does not time, with the median of its method's runs finished here."""
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,wall_s,target\n"
                        "s,fedsage_plus,ok,1200.0,results/runs/s/fedsage_plus/Cora/x/k5/seed0.json\n"
                        "s,fedavg,ok,900.0,results/runs/s/fedavg/Cora/x/k5/seed1.json\n"
                        "s,fedtad,failed,50.0,results/runs/s/fedtad/Cora/x/k5/seed0.json\n")
    stored = stored_costs(snapshot)
    assert stored == {("s", "fedsage_plus", "Cora", "x", "k5", "seed0.json"): 1200.0,
                      ("s", "fedavg", "Cora", "x", "k5", "seed1.json"): 900.0}
    runs = tmp_path / "elsewhere" / "runs" / "s"
    planned = [(runs / "fedavg/Cora/x/k10/seed0.json", "fedavg"), (runs / "fedavg/Cora/x/k5/seed1.json", "fedavg"),
               (runs / "fedsage_plus/Cora/x/k5/seed0.json", "fedsage_plus"),
               (runs / "fedtad/Cora/x/k5/seed0.json", "fedtad")]
    progress = Progress(planned, workers=1, stored=stored)
    progress.update()
    assert progress.line() == ("progress: 0 of 4 training runs done (0 %), 0.0 CPU-min so far; about 35 min left "
                               "at 1 at a time (2 runs estimated from docs/results; not counted: 2 runs of fedavg, "
                               "fedtad, not timed yet)")
    planned[0][0].parent.mkdir(parents=True)
    finish(planned[0][0], "fedavg", 60.0)
    progress.update()
    assert progress.line() == ("progress: 1 of 4 training runs done (25 %), 1.0 CPU-min so far; about 35 min left "
                               "at 1 at a time (2 runs estimated from docs/results; not counted: 1 runs of fedtad, "
                               "not timed yet)")
    assert stored_costs(tmp_path / "absent.csv") == {}


def test_stored_times_are_scaled_by_this_run_s_speed_so_the_dearest_jobs_first_do_not_inflate_the_estimate(
        tmp_path):
    """With the dearest jobs first, a method's first finished run is its longest: the others count with their
    own stored times, scaled by how this run's finished runs compare with theirs in the snapshot (the method's
    own where one has finished, else all methods'); a run the snapshot does not time counts with its method's
    median here."""
    runs = tmp_path / "runs" / "s"
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,cpu_s,target\n" + "".join(
        f"s,{run},ok,{cpu},results/runs/s/{run}/Cora/x/k{k}/seed0.json\n"
        for run, k, cpu in [("fedsage_plus", 20, 400.0), ("fedsage_plus", 10, 100.0), ("fedsage_plus", 5, 100.0),
                            ("fedavg", 20, 10.0)]))
    planned = [(runs / f"{run}/Cora/x/k{k}/seed0.json", run)
               for run, k in [("fedsage_plus", 20), ("fedsage_plus", 10), ("fedsage_plus", 5), ("fedavg", 20),
                              ("fedavg", 10)]]
    for path, _ in planned:
        path.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(planned, workers=1, stored=stored_costs(snapshot))
    finish(planned[0][0], "fedsage_plus", 480.0)
    progress.update()
    assert progress.speed() == {None: 1.2, "fedsage_plus": 1.2}
    # 100 * 1.2 twice, fedavg's 10 * 1.2 (no fedavg run finished yet): 252 s; the old median rule said 970 s
    assert progress.line() == ("progress: 1 of 5 training runs done (20 %), 8.0 CPU-min so far; about 4 min left at "
                               "1 at a time (3 runs estimated from docs/results; not counted: 1 runs of fedavg, "
                               "not timed yet)")
    finish(planned[3][0], "fedavg", 5.0)
    progress.update()
    assert progress.speed() == {None: 485.0 / 410.0, "fedsage_plus": 1.2, "fedavg": 0.5}
    assert progress.line().endswith("about 4 min left at 1 at a time (2 runs estimated from docs/results)")
    finish(planned[1][0], "fedsage_plus", 90.0)
    finish(planned[2][0], "fedsage_plus", 150.0)
    progress.update()
    assert progress.line().endswith("; under a minute left at 1 at a time")


def test_the_snapshot_s_cpu_seconds_come_before_its_wall_seconds(tmp_path):
    """A run without ``cpu_s`` (folded before runs recorded it) counts with its cell's other seeds' CPU seconds
    where one recorded them: its wall time, often taken under load, can be several times its CPU time."""
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,wall_s,cpu_s,target\n"
                        "s,a,ok,1200.0,300.0,results/runs/s/a/Cora/x/k5/seed0.json\n"
                        "s,a,ok,1500.0,,results/runs/s/a/Cora/x/k5/seed1.json\n"
                        "s,a,ok,1500.0,340.0,results/runs/s/a/Cora/x/k5/seed2.json\n"
                        "s,a,ok,1500.0,,results/runs/s/a/Cora/x/k10/seed1.json\n"
                        "s,b,ok,900.0,,results/runs/s/b/Cora/x/k5/seed0.json\n")
    assert stored_costs(snapshot) == {("s", "a", "Cora", "x", "k5", "seed0.json"): 300.0,
                                      ("s", "a", "Cora", "x", "k5", "seed1.json"): 320.0,
                                      ("s", "a", "Cora", "x", "k5", "seed2.json"): 340.0,
                                      ("s", "a", "Cora", "x", "k10", "seed1.json"): 1500.0,
                                      ("s", "b", "Cora", "x", "k5", "seed0.json"): 900.0}


def test_grid_points_the_snapshot_does_not_keep_count_with_the_point_it_kept_for_the_same_cell(tmp_path):
    """The snapshot keeps one point per grid cell (the one validation chose): the other points of that cell
    count with its time (or with the cell's run from before it had a grid), those of a seed it lacks with its
    other seeds'; a point of another cell (another client count) does not."""
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,cpu_s,wall_s,target\n"
                        "s,g,ok,120.0,130.0,results/runs/s/g@tau=0.5/Cora/x/k5/seed0.json\n"
                        "s,h,ok,600.0,610.0,results/runs/s/h/Cora/x/k5/seed0.json\n")
    runs = tmp_path / "runs" / "s"
    planned = [(runs / "g@tau=0.5/Cora/x/k5/seed0.json", "fedgkd"),
               (runs / "g@tau=0.05/Cora/x/k5/seed0.json", "fedgkd"),
               (runs / "g@tau=0.05/Cora/x/k5/seed1.json", "fedgkd"),
               (runs / "h@tau=0.5/Cora/x/k5/seed0.json", "fedavg"),
               (runs / "g@tau=0.05/Cora/x/k10/seed0.json", "fedgkd")]
    progress = Progress(planned, workers=1, stored=stored_costs(snapshot))
    assert progress.stored == {planned[0][0]: 120.0, planned[1][0]: 120.0, planned[2][0]: 120.0,
                               planned[3][0]: 600.0}
    progress.update()
    assert progress.line() == ("progress: 0 of 5 training runs done (0 %), 0.0 CPU-min so far; about 16 min left "
                               "at 1 at a time (4 runs estimated from docs/results; not counted: 1 runs of fedgkd, "
                               "not timed yet)")


def test_a_seed_the_snapshot_lacks_counts_with_the_median_of_its_cell_s_other_seeds(tmp_path):
    """Running the seeds a cell still needs (e.g. the papers' seeds 1-2 where the snapshot holds seed 0): each
    counts with the median of the seeds the snapshot has of the same cell, not as not timed."""
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,cpu_s,target\n"
                        "s,fedgm_ft,ok,2000.0,results/runs/s/fedgm_ft/Computers/x/k10/seed0.json\n"
                        "s,fedgm_ft,ok,2400.0,results/runs/s/fedgm_ft/Computers/x/k10/seed1.json\n"
                        "s,fedgm_ft,ok,50.0,results/runs/s/fedgm_ft/Cora/x/k10/seed0.json\n")
    runs = tmp_path / "runs" / "s" / "fedgm_ft"
    planned = [(runs / "Computers/x/k10/seed2.json", "finetune"), (runs / "Computers/x/k5/seed2.json", "finetune")]
    progress = Progress(planned, workers=2, stored=stored_costs(snapshot))
    assert progress.stored == {planned[0][0]: 2200.0}
    progress.update()
    assert progress.line() == ("progress: 0 of 2 training runs done (0 %), 0.0 CPU-min so far; about 18 min left "
                               "at 2 at a time (1 runs estimated from docs/results; not counted: 1 runs of finetune, "
                               "not timed yet)")


def test_a_row_the_study_never_ran_counts_with_the_same_row_on_the_same_dataset_and_clients_elsewhere(tmp_path):
    """O-pFGL's Table 18 (Metis) runs FedGM+ft on Computers-10 where the snapshot holds it only from Table 17
    (Louvain): those seeds count with the median of that row's stored runs on Computers-10 in any study or
    scheme, the same cells :func:`fglrepro.resources.lookup` declares from; another client count does not."""
    snapshot = tmp_path / "runs.csv"
    snapshot.write_text("study,run,status,cpu_s,target\n"
                        "t17,fedgm_ft,ok,2000.0,results/runs/t17/fedgm_ft/Computers/louvain/k10/seed0.json\n"
                        "t17,fedgm_ft,ok,2400.0,results/runs/t17/fedgm_ft/Computers/louvain/k10/seed1.json\n"
                        "t17,fedgm_ft,ok,2300.0,results/runs/t17/fedgm_ft/Computers/louvain/k10/seed2.json\n"
                        "t17,fedgm_ft,ok,100.0,results/runs/t17/fedgm_ft/Computers/louvain/k5/seed0.json\n"
                        "t17,fedlog,ok,400.0,results/runs/t17/fedlog/Computers/louvain/k10/seed0.json\n")
    runs = tmp_path / "runs" / "t18"
    planned = [(runs / f"fedgm_ft/Computers/metis/k10/seed{seed}.json", "finetune") for seed in range(3)]
    planned.append((runs / "fedgm_ft/Computers/metis/k20/seed0.json", "finetune"))
    progress = Progress(planned, workers=1, stored=stored_costs(snapshot))
    assert progress.stored == {path: 2300.0 for path, _ in planned[:3]}
    progress.update()
    assert progress.line() == ("progress: 0 of 4 training runs done (0 %), 0.0 CPU-min so far; about 1 h 55 min "
                               "left at 1 at a time (3 runs estimated from docs/results; not counted: 1 runs of "
                               "finetune, not timed yet)")


def test_one_job_at_a_time_when_fewer_runs_are_left_than_workers(tmp_path):
    done, left = tmp_path / "done.json", tmp_path / "left.json"
    progress = Progress([(done, "fedavg"), (left, "fedavg")], workers=8)
    finish(done, "fedavg", 300.0)
    progress.update()
    assert progress.line().endswith("about 5 min left at 1 at a time")


def test_start_prints_first_line_early_then_every_interval(tmp_path):
    stream = io.StringIO()
    start([(tmp_path / "run.json", "fedavg")], workers=1, every_s=3600.0, first_after_s=0.01, stream=stream)
    deadline = time.monotonic() + 5
    while "progress: 0 of 1" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert stream.getvalue().count("progress: 0 of 1 training runs done") == 1


def logged_rounds(caplog, every_s):
    progress = RoundProgress(rounds=40, average="weighted", every_s=every_s)
    metrics = {"val_acc": 0.5, "test_acc": 0.5}
    with caplog.at_level(logging.INFO, logger="fglrepro.fl.loop"):
        caplog.clear()
        for round_ in range(1, 41):
            progress({"round": round_, "train_loss": 1.0, "weighted": metrics})
    return [int(r.getMessage().split()[1].split("/")[0]) for r in caplog.records]


def test_a_training_job_logs_every_tenth_of_its_rounds_and_after_every_slow_stretch(caplog):
    assert logged_rounds(caplog, every_s=3600) == [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    assert logged_rounds(caplog, every_s=0) == list(range(1, 41))


def test_durations_read_as_a_person_would_say_them():
    assert [duration(s) for s in (20, 29.9 * 60, 95 * 60, 125 * 60)] == [
        "under a minute", "about 30 min", "about 1 h 35 min", "about 2 h 05 min"]


def test_a_stopped_run_names_its_stopped_jobs_and_how_to_resume(tmp_path):
    from fglrepro.progress import stop_message, stopped_jobs

    logs = tmp_path / "logs" / "train"
    stopped = logs / "s" / "fedavg" / "seed0.log"
    failed = logs / "s" / "fedprox" / "seed0.log"
    old = logs / "s" / "moon" / "seed0.log"
    stop_line = "x WARNING fgl-train: stopped by SIGINT; the checkpoint c holds rounds 1-7"
    for path, text in ((stopped, f"x INFO start\n{stop_line}"), (failed, "x ERROR ValueError: bad"),
                       (old, "x WARNING fgl-train: stopped by SIGTERM; old")):
        path.parent.mkdir(parents=True)
        path.write_text(text + "\n")
    since = time.time() - 60
    os.utime(old, (since - 600, since - 600))  # written by an earlier run
    found = stopped_jobs(logs, since)
    assert found == [(stopped, stop_line)]
    message = stop_message(found)
    assert "1 training job(s) stopped by a signal" in message and "holds rounds 1-7" in message
    assert "run the same snakemake command again" in message
    assert stop_message(stopped_jobs(logs / "none", since)) == ""


def test_a_run_that_aggregated_damaged_run_files_ends_by_naming_them_and_how_to_rebuild(tmp_path):
    logs = tmp_path / "logs" / "aggregate"
    logs.mkdir(parents=True)
    bad = "damaged file r/runs/s/fedavg/seed0.json (JSONDecodeError: x); it is made by rule train. Rebuild it with: " \
          "snakemake --cores all -R 'r/runs/s/fedavg/seed0.json' (its row has status unreadable)"
    (logs / "s.log").write_text(f"x INFO fgl-aggregate: 2 runs aggregated\nx WARNING fgl-aggregate: {bad}\n")
    (logs / "old.log").write_text("x WARNING fgl-aggregate: damaged file r/runs/old/seed0.json (E)\n")
    since = time.time() - 60
    os.utime(logs / "old.log", (since - 600, since - 600))  # written by an earlier run
    message = damaged_runs_message(logs, since)
    assert message.startswith("1 run file(s) could not be read") and message.endswith(bad)
    assert "runs/old" not in message
    assert damaged_runs_message(tmp_path / "none", since) == ""


def test_the_lock_hint_tells_an_active_run_from_a_gone_one(tmp_path):
    import subprocess
    import sys

    from fglrepro.processes import process_alive
    from fglrepro.progress import lock_hint, record_active_run

    locks, active = tmp_path / "locks", tmp_path / "active.json"
    assert lock_hint(locks, active) == ""  # nothing locked
    locks.mkdir()
    (locks / "0.input.lock").write_text("")
    assert "Another run may be active" in lock_hint(locks, active)  # locked, no record of who
    record_active_run(os.getpid(), ["snakemake", "--cores", "2"], active)
    assert "Another run is active" in lock_hint(locks, active) and "Do NOT --unlock" in lock_hint(locks, active)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not process_alive(gone.pid) and process_alive(os.getpid())
    record_active_run(gone.pid, ["snakemake"], active)
    assert "left by a run that is gone" in lock_hint(locks, active)
    assert "`snakemake --unlock` is safe" in lock_hint(locks, active)


def test_a_slow_loop_logs_its_items_at_most_every_interval_and_a_fast_one_stays_silent(caplog):
    now = [0.0]
    with caplog.at_level(logging.INFO, logger="fglrepro.fl.ticker"):
        fast = Ticker("fast", 10, every_s=30.0, clock=lambda: now[0])
        for _ in range(10):
            now[0] += 2.0
            fast.tick()
        assert caplog.records == []
        now[0] = 0.0
        slow = Ticker("round 1, clients updated", 4, every_s=30.0, clock=lambda: now[0])
        for seconds in (20.0, 15.0, 10.0, 40.0):
            now[0] += seconds
            slow.tick()
    assert [r.getMessage() for r in caplog.records] == ["round 1, clients updated: 2/4 (35 s)",
                                                        "round 1, clients updated: 4/4 (85 s)"]


def test_a_sequential_round_says_how_many_clients_are_done_when_it_is_slow(caplog, monkeypatch):
    """The shared loop's per-client path (:meth:`FederatedMethod.client_updates`) ticks once per client."""
    import fglrepro.fl.ticker as ticker
    from fglrepro.fl.method import FederatedMethod

    now = [0.0]
    monkeypatch.setattr(ticker.time, "monotonic", lambda: now[0])

    class Slow:
        federation = type("F", (), {"engine": None})()
        caps = None

        def client_update(self, k, round_):
            now[0] += 31.0
            return None if k == 1 else f"upload {k}"

    with caplog.at_level(logging.INFO, logger="fglrepro.fl.ticker"):
        uploads = FederatedMethod.client_updates(Slow(), [0, 1, 2], round_=3)
    assert uploads == {0: "upload 0", 2: "upload 2"}
    assert [r.getMessage() for r in caplog.records] == [f"round 3, clients updated: {i}/3 ({31 * i} s)"
                                                        for i in (1, 2, 3)]


def test_the_end_of_a_workflow_cancels_pending_rescheduling_timers_so_the_process_exits_at_once():
    """A one-minute ``max-jobs-per-timespan`` leaves a non-daemon timer that would hold the ended process."""
    fired = []
    timer = threading.Timer(600, lambda: fired.append(True))
    timer.start()
    other = threading.Thread(target=time.sleep, args=(0.2,))
    other.start()
    cancel_rescheduling_timers()
    timer.join(timeout=5)
    other.join(timeout=5)
    assert not timer.is_alive() and not fired and not other.is_alive()
