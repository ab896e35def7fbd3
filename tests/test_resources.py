"""A training job's declared memory from the peaks a results snapshot measured (fglrepro.resources)."""

from __future__ import annotations

from fglrepro.resources import FLOOR_MB, declared_mb, measured_mem_mb, measured_peaks

HEADER = "study,run,dataset,clients,seed,status,device,peak_memory_mb\n"


def test_the_highest_cpu_peak_of_ok_runs_counts_per_study_cell_and_per_row_cell(tmp_path):
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text(HEADER
                        + "s,fedavg,Cora,10,0,ok,cpu,900\n"
                          "s,fedavg,Cora,10,1,ok,cpu,1100\n"
                          "s,fedavg,Cora,10,2,failed,cpu,9000\n"  # a failed run's peak says nothing
                          "s,fedavg,Cora,10,3,ok,cuda,20000\n"  # a CUDA run's peak is GPU memory
                          "s,fedavg,Cora,10,4,ok,cpu,\n"  # folded before peaks were recorded
                          "t,fedavg,Cora,10,0,ok,cpu,1500\n")
    peaks = measured_peaks(runs_csv)
    assert peaks[("s", "fedavg", "Cora", 10)] == 1100.0 and peaks[("t", "fedavg", "Cora", 10)] == 1500.0
    assert peaks[("fedavg", "Cora", 10)] == 1500.0
    assert measured_peaks(tmp_path / "absent.csv") == {}


def test_a_job_declares_a_quarter_over_its_measured_peak_in_steps_of_500_mb():
    assert declared_mb(1100.0) == 1500  # 1.25 x 1100 MiB = 1441.8 MB
    assert declared_mb(3000.0) == 4000  # 3932.2 MB
    assert declared_mb(100.0) == FLOOR_MB
    peaks = {("s", "fedgkd", "Cora", 10): 1100.0, ("fedgkd", "Cora", 10): 3000.0, ("fedgkd", "Cora", 20): 3000.0}
    assert measured_mem_mb(peaks, "s", "fedgkd@tau_s=3.0", "Cora", "10") == 1500  # a grid point is its row
    assert measured_mem_mb(peaks, "s", "fedgkd", "Cora", 20) == 4000  # another study's run of the row
    assert measured_mem_mb(peaks, "s", "fedgkd", "Cora", 5) is None  # never measured
