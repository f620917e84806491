#!/usr/bin/env bash
# Everything a lent GPU should do for the NCCL dialect, in one device call of at most 20
# minutes, writing under $OUT (at most 8 files come back: a log, the tables, one archive).
#
#   bash scripts/gpu_session.sh                   # on the device machine, from the repo root
#
# The device image has python3 with a CUDA torch and nvidia-nccl-cu13, gcc, no network. What
# the project needs beyond it travels as wheels: before the call, here,
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       -d .whl simpy==4.1.1 'setuptools>=74.1'
# (setuptools: the project's native extensions build with the pyproject's ext-modules table,
# which older setuptools do not read; the wheels go first on PYTHONPATH).
# and name `.whl` in the call's carry. Steps, each bounded, each one's output in session.log:
#   1. the machine: GPU, driver, torch, its NCCL;
#   2. build: the NCCL plugins (make -C nccl_patch), the project installed in place;
#   3. transcripts of real NCCL on the real driver (scripts/nccl_record.py) and every wire
#      fact checked on them (scripts/nccl_verify.py);
#   4. perf on the GPU: W = 2 every rank real against emulated (the prototype's Table 1),
#      interleaved three times; emulated W = 8, 64, 512 (one real rank, #wrong checked);
#   5. the DDP example under neuronabox torchrun --backend nccl at W = 2, 8, 64.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
LOG=$OUT/session.log
TABLES=$OUT/tables.md
WORK=$(mktemp -d)
exec > >(tee -a "$LOG") 2>&1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }
bounded() { local limit=$1; shift; timeout --kill-after=10 "$limit" "$@"; echo "--- exit $? : $*"; }

step "1. the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'

step "2. build"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
bounded 300 make -C nccl_patch
bounded 600 python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
NBX="python3 -m neuronabox.cli"
$NBX --help >/dev/null || { echo "the project does not import here; stopping"; exit 1; }

step "3. transcripts on the real driver"
bounded 300 python3 scripts/nccl_record.py --out "$WORK/nccl" --worlds 2,4 --timing
bounded 120 python3 scripts/nccl_verify.py "$WORK/nccl"

step "4. perf --backend nccl --device cuda"
{
    echo "# perf on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
    echo
} >"$TABLES"
perf() { # NAME ARGS...: one perf run, its table appended to tables.md
    local name=$1; shift
    echo "## $name: neuronabox perf $*" >>"$TABLES"
    timeout --kill-after=10 240 $NBX perf "$@" --backend nccl --device cuda -J "$WORK/$name.json" \
        >"$WORK/$name.txt" 2>&1
    echo "--- exit $? : perf $name"
    cat "$WORK/$name.txt" | tee -a "$TABLES"
    echo >>"$TABLES"
}
SIZES=(-b 1K -e 256M -f 4 -n 20 -w 5)
for rep in 1 2 3; do
    if [ $((rep % 2)) = 1 ]; then order="all emu"; else order="emu all"; fi
    for side in $order; do
        if [ "$side" = all ]; then
            perf "table1-all-real-$rep" all_reduce "${SIZES[@]}" --nnodes 2 --all-real
        else
            perf "table1-emulated-$rep" all_reduce "${SIZES[@]}" --nnodes 2 --delay-model zero
        fi
    done
done
for w in 8 64 512; do
    for coll in all_reduce all_gather; do
        perf "emulated-w$w-$coll" "$coll" -b 1K -e 64M -f 8 -n 10 -w 2 --nnodes "$w" --topology ib-100g
    done
done

step "5. the DDP example under neuronabox torchrun --backend nccl"
for w in 2 8 64; do
    bounded 180 $NBX torchrun --nnodes "$w" --nproc-per-node 1 --backend nccl --trace "$WORK/ddp-w$w.jsonl" \
        examples/train_ddp.py --steps 5 --backend nccl
done

step "done: packing"
tar -czf "$OUT/results.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
