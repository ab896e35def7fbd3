#!/usr/bin/env bash
# The CUDA checks of a lent GPU machine, in one command (see benchmarks/README.md, "GPU"):
#   1. the raw Cora and CiteSeer files bundled in resources/ prepared there (as the workflow does);
#   2. the CUDA tests: the engine's CUDA-vs-CPU check and every method of the studies on CUDA (test_cuda.py);
#   3. benchmarks/method_costs.py on CUDA: FedGKC and FedSage+ on Cora-10 and CiteSeer-10 against
#      FedAvg (3 repetitions), then the other heavy methods on Cora-10 (1 repetition), then FedGKC and
#      FedAvg on Cora-10 on the same machine's CPU (one thread) for a same-machine comparison.
# Expects, prepared here: the jobs of method_costs.py --export in .gpu/jobs.json, their partitions in
# results/partitions (carried) and, where the machine lacks them, wheels in .whl/ (carried).
# Writes its logs and tables under $OUT (default: results/gpu). DEVICE=cpu rehearses it on a machine
# without a GPU (the CUDA tests then skip); *_DEADLINE bound the benchmark's two parts in seconds.
set -uo pipefail
OUT=${OUT:-results/gpu} DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torch, torch_geometric as g; print('torch', torch.__version__, 'PyG', g.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
for dataset in Cora CiteSeer; do
    record=data/raw/$dataset/download.json
    python3 -m fglrepro.cli.data download --dataset $dataset --root data/raw --mirror resources/datasets --out $record || exit 1
    python3 -m fglrepro.cli.data prepare --dataset $dataset --root data/raw --record $record \
        --out data/prepared/$dataset/plain.pt || exit 1
    python3 -m fglrepro.cli.data prepare --dataset $dataset --root data/raw --record $record \
        --largest-component --normalize-features --out data/prepared/$dataset/lcc-norm.pt || exit 1
done
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_engine.py tests/test_cuda.py 2>&1 \
    | tee "$OUT/pytest.log" | tail -5
python3 benchmarks/method_costs.py --jobs .gpu/jobs.json --device $DEVICE --share-reference \
    --studies fedtad_table2 fedgkc_table1 --runs fedgkc fedsage_plus --repeats 3 --deadline "${MAIN_DEADLINE:-180}" \
    --out "$OUT/GPU_COSTS_MAIN"
python3 benchmarks/method_costs.py --jobs .gpu/jobs.json --device $DEVICE --share-reference --datasets Cora \
    --studies fedgkc_table1 fedgkd_table1 fedgls_table1 fedtad_table2 opfgl_table1 \
    --runs fedkd fml fedgkd fedgls fedtad opfgl --repeats 1 --deadline "${OTHER_DEADLINE:-80}" --out "$OUT/GPU_COSTS_OTHER"
python3 benchmarks/method_costs.py --jobs .gpu/jobs.json --device cpu --datasets Cora --studies fedgkc_table1 \
    --runs fedgkc --repeats 1 --out "$OUT/GPU_COSTS_HOSTCPU"
