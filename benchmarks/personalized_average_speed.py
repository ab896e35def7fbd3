"""Time ``personalized_average`` (one matrix product per parameter) against the same mixing done
as one ``weighted_average`` per receiver, on the parameter shapes of FedGKD's CiteSeer model
(GCN 3703 -> 128 -> 128 + linear READOUT to 6 classes), K = R clients; writes
PERSONALIZED_AVERAGE.md next to this script.

    python benchmarks/personalized_average_speed.py
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from fglrepro.fl.aggregation import personalized_average, weighted_average

SHAPES = {"conv1.weight": (128, 3703), "conv1.bias": (128,), "conv2.weight": (128, 128), "conv2.bias": (128,),
          "head.weight": (6, 128), "head.bias": (6,)}


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    lines = ["# personalized_average: one matrix product vs one weighted average per receiver", "",
             f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, one thread; "
             "best of 3. Written by `python benchmarks/personalized_average_speed.py`.", "",
             "| clients K = receivers | per-receiver weighted_average (s) | personalized_average (s) | speed-up |"
             " max abs difference |", "|---:|---:|---:|---:|---:|"]
    for k in (10, 30, 50):
        gen = torch.Generator().manual_seed(k)
        states = [{key: torch.randn(shape, generator=gen) for key, shape in SHAPES.items()} for _ in range(k)]
        weights = torch.softmax(torch.randn(k, k, generator=gen), dim=1)
        loop = best_of(lambda: [weighted_average(states, row.tolist()) for row in weights])
        fused = best_of(lambda: personalized_average(states, weights))
        diff = max((a[key] - b[key]).abs().max().item() for a, b in
                   zip(personalized_average(states, weights), [weighted_average(states, r.tolist()) for r in weights])
                   for key in SHAPES)
        lines.append(f"| {k} | {loop:.3f} | {fused:.3f} | {loop / fused:.1f}x | {diff:.1e} |")
        print(lines[-1], flush=True)
    (Path(__file__).parent / "PERSONALIZED_AVERAGE.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
