"""What a training job declares from what a results snapshot measured (fglrepro.resources)."""

from __future__ import annotations

from fglrepro.resources import FLOOR_MB, FLOOR_MINUTES, declared_mb, declared_minutes, lookup, measured, priority

HEADER = "study,run,dataset,clients,seed,status,device,peak_memory_mb,cpu_s,wall_s\n"


def test_the_highest_cpu_peak_and_cost_of_ok_runs_count_per_study_cell_and_per_row_cell(tmp_path):
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text(HEADER
                        + "s,fedavg,Cora,10,0,ok,cpu,900,40,50\n"
                          "s,fedavg,Cora,10,1,ok,cpu,1100,30,90\n"  # CPU seconds where recorded, not wall
                          "s,fedavg,Cora,10,2,failed,cpu,9000,999,999\n"  # a failed run says nothing
                          "s,fedavg,Cora,10,3,ok,cuda,20000,1,1\n"  # a CUDA run's peak is GPU memory
                          "s,fedavg,Cora,10,4,ok,cpu,,,70\n"  # folded before peaks and CPU time were recorded
                          "t,fedavg,Cora,10,0,ok,cpu,1500,20,25\n"
                          "t,fedavg,Cora,20,0,ok,cpu,,,80\n")  # a cell no run timed in CPU: its wall time
    found = measured(runs_csv)
    assert found.peak_mib[("s", "fedavg", "Cora", 10)] == 1100.0
    assert found.peak_mib[("t", "fedavg", "Cora", 10)] == found.peak_mib[("fedavg", "Cora", 10)] == 1500.0
    # the wall time of a run without cpu_s (70, maybe under load) does not count where CPU times are known
    assert found.seconds[("s", "fedavg", "Cora", 10)] == 40.0 and found.seconds[("t", "fedavg", "Cora", 10)] == 20.0
    assert found.seconds[("fedavg", "Cora", 10)] == 40.0
    assert found.seconds[("t", "fedavg", "Cora", 20)] == found.seconds[("fedavg", "Cora", 20)] == 80.0
    assert measured(tmp_path / "absent.csv") == ({}, {})


def test_a_job_declares_a_quarter_over_its_measured_peak_in_steps_of_500_mb():
    assert declared_mb(1100.0) == 1500  # 1.25 x 1100 MiB = 1441.8 MB
    assert declared_mb(3000.0) == 4000  # 3932.2 MB
    assert declared_mb(100.0) == FLOOR_MB


def test_a_job_declares_three_times_its_measured_cost_in_steps_of_five_minutes():
    assert declared_minutes(1000.0) == 50  # 3 x 1000 s = 50 min
    assert declared_minutes(1001.0) == 55
    assert declared_minutes(5.0) == FLOOR_MINUTES


def test_a_grid_point_counts_as_its_row_and_another_studys_run_as_a_fallback():
    table = {("s", "fedgkd", "Cora", 10): 1100.0, ("fedgkd", "Cora", 10): 3000.0, ("fedgkd", "Cora", 20): 3000.0}
    assert lookup(table, "s", "fedgkd@tau_s=3.0", "Cora", "10") == 1100.0
    assert lookup(table, "s", "fedgkd", "Cora", 20) == 3000.0
    assert lookup(table, "s", "fedgkd", "Cora", 5) is None


def test_the_dearest_jobs_come_first_and_a_job_never_measured_counts_as_long():
    assert priority(500.7, 30) == 500 > priority(20.0, 30) == 20
    assert priority(None, 30) == 1800 > priority(1000.0, 30)
