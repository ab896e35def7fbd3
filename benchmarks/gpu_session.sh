#!/usr/bin/env bash
# The checks and runs of a lent GPU machine, in one command (see benchmarks/README.md, "GPU").
# Stages (STAGES, default "tests queue"):
#   tests  the CUDA tests: the engine's CUDA-vs-CPU check and every method of the studies on CUDA
#          (test_cuda.py), in the background while the queue runs (they need no prepared data);
#   queue  benchmarks/device_queue.py run: the exported queues .gpu/queue*.json (training jobs the results
#          snapshot lacks, their download / prepare jobs) on WORKERS processes on $DEVICE (GPU_RUNS: the runs
#          (table rows) starting so on CUDA on GPU_WORKERS processes, the rest on the CPU cores), then the run
#          JSONs as $OUT/runs.tgz and the jobs' logs as $OUT/queue_logs.tgz;
#   costs  benchmarks/method_costs.py on $DEVICE: FedGKC and FedSage+ against FedAvg on Cora-10 and
#          CiteSeer-10, then the other heavy methods on Cora-10 (jobs from --export in .gpu/jobs.json).
# Carry .gpu (queues; .gpu/git: a shallow clone's .git, so that runs record their commit; .gpu/datasets:
# raw files of datasets not bundled in resources/, the layout of ../shared/datasets), results/partitions
# and, where the machine lacks them, wheels in .whl/. Writes under $OUT (default results/gpu).
# DEVICE=cpu rehearses it on a machine without a GPU (the CUDA tests then skip).
set -uo pipefail
OUT=${OUT:-results/gpu} DEVICE=${DEVICE:-cuda} STAGES=${STAGES:-tests queue}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .gpu/git ]; then  # the machine's .git is the session's first state, not this commit
    rm -rf .git && cp -r .gpu/git .git && printf '/.gpu/\n/.whl/\n' >> .git/info/exclude
fi
echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown), $(git status --porcelain 2>/dev/null | wc -l) changed paths"
if [ -d .gpu/datasets ] && [ ! -e ../shared/datasets ]; then
    mkdir -p ../shared && ln -s "$PWD/.gpu/datasets" ../shared/datasets
fi
python3 -c "import torch, torch_geometric as g; print('torch', torch.__version__, 'PyG', g.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv 2>/dev/null
nproc
if [[ " $STAGES " == *" tests "* ]]; then
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -o addopts=-ra -m cuda tests/test_engine.py tests/test_cuda.py \
        > "$OUT/pytest.log" 2>&1 &
    tests=$!
fi
if [[ " $STAGES " == *" queue "* ]]; then
    python3 benchmarks/device_queue.py run --queue .gpu/queue*.json --workers "${WORKERS:-$(nproc)}" --device "$DEVICE" \
        --gpu-runs ${GPU_RUNS:-} --gpu-workers "${GPU_WORKERS:-3}" \
        --deadline "${QUEUE_DEADLINE:-360}" --grace "${QUEUE_GRACE:-60}" --log "$OUT/queue.csv" 2>&1 | tee "$OUT/queue.log"
    find results/runs -name 'seed*.json' | tar czf "$OUT/runs.tgz" -T -  # not the stopped runs' checkpoints
    tar czf "$OUT/queue_logs.tgz" results/logs/device_queue
fi
if [ -n "${tests:-}" ]; then
    wait "$tests"
    tail -5 "$OUT/pytest.log"
fi
if [[ " $STAGES " == *" costs "* ]]; then
    python3 benchmarks/method_costs.py --jobs .gpu/jobs.json --device "$DEVICE" --share-reference \
        --studies fedtad_table2 fedgkc_table1 --runs fedgkc fedsage_plus --repeats 3 --deadline "${MAIN_DEADLINE:-180}" \
        --out "$OUT/GPU_COSTS_MAIN"
    python3 benchmarks/method_costs.py --jobs .gpu/jobs.json --device "$DEVICE" --share-reference --datasets Cora \
        --studies fedgkc_table1 fedgkd_table1 fedgls_table1 fedtad_table2 opfgl_table1 \
        --runs fedkd fml fedgkd fedgls fedtad opfgl --repeats 1 --deadline "${OTHER_DEADLINE:-80}" \
        --out "$OUT/GPU_COSTS_OTHER"
fi
