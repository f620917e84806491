#!/usr/bin/env bash
# Everything a lent GPU should do for the NCCL dialect, in one device call,
# writing under $OUT (at most 8 files come back: a log, the tables, one archive).
#
#   bash scripts/gpu_session.sh                   # on the device machine, from the repo root
#
# The device image has python3 with a CUDA torch and nvidia-nccl-cu13, gcc, no network. What
# the project needs beyond it travels as wheels: before the call, here,
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl simpy==4.1.2 setuptools==84.2.1 protobuf==7.36.2 grpcio==1.85.3
# (setuptools: the project's native extensions build with the pyproject's ext-modules table,
# which older setuptools do not read; protobuf and grpcio: the generated code's versions;
# the wheels go first on PYTHONPATH)
# and name `.whl` in the call's carry. Steps, each bounded, each one's output in session.log:
#   1. the machine: GPU, driver, torch, its NCCL;
#   2. build: the NCCL plugins (make -C nccl_patch), the project installed in place;
#   3. transcripts of real NCCL on the real driver (scripts/nccl_record.py) and every wire
#      fact checked on them (scripts/nccl_verify.py);
#   4. perf on the GPU: W = 2 every rank real against emulated (the prototype's Table 1),
#      interleaved twice;
#   5. the DDP example under neuronabox torchrun --backend nccl at W = 2, 8;
#   6. emulated W = 8, 64, 512 (one real rank, #wrong checked);
#   7. the DDP example's step times, every rank real against one emulated, at W = 2;
#   8. the Gloo fidelity table where every process has a core of its own (the machine has 16;
#      issue 25's bar): validate at W = 2 on loopback, six workloads, 5 repetitions;
#   9. the same at W = 4 on netns behind 1 Gbit links, where the kernel lets us make them.
# Steps 8 and 9 use the GPU not at all: they borrow the lent machine's cores. Lightning and
# transformers come with its image.
# The whole session keeps to NBX_GPU_BUDGET seconds (default 500: a lease is 15 minutes of
# device time, the machine's start included); a step the budget cannot hold is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
LOG=$OUT/session.log
TABLES=$OUT/tables.md
WORK=$(mktemp -d)
BUDGET=${NBX_GPU_BUDGET:-500} # seconds for the whole session; each step is cut to what is left
STEPS=${NBX_GPU_STEPS:-3 4 5 6 7} # which of steps 3-7 to run (1 and 2 always run)
export TMPDIR=$WORK/tmp # every run's own folder (logs, the controller's output) comes back in the archive
mkdir -p "$TMPDIR"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$LOG") 2>&1
step() { echo; echo "=== $* ($(date -u +%H:%M:%S), ${SECONDS} s in)"; }
# bounded LIMIT CMD...: run CMD for at most LIMIT seconds and never past the budget (20 s kept for packing).
bounded() {
    local limit=$1; shift
    local left=$((BUDGET - SECONDS - 20))
    if [ "$left" -lt 10 ]; then echo "--- skipped (budget spent): $*"; return 0; fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout --kill-after=5 "$limit" "$@"
    echo "--- exit $? after ${SECONDS} s : $*"
}

step "1. the machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
nproc

# Two real ranks on one GPU time-slice it (each one's NCCL kernel spins while the other's
# context holds the GPU); NBX_GPU_MPS=1 runs them under CUDA MPS, side by side, as on two GPUs.
if [ "${NBX_GPU_MPS:-0}" = 1 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=$WORK/mps CUDA_MPS_LOG_DIRECTORY=$WORK/mps
    mkdir -p "$WORK/mps"
    if nvidia-cuda-mps-control -d; then
        echo "CUDA MPS started"
        trap 'echo quit | nvidia-cuda-mps-control' EXIT
    else
        echo "CUDA MPS did not start: ranks time-slice the GPU"
    fi
fi

step "2. build"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [[ " $STEPS " =~ " "[3-7]" " ]]; then bounded 90 make -j8 -C nccl_patch; fi
bounded 180 python3 -m pip install -q --no-deps --no-build-isolation --no-index -e .
NBX="python3 -m neuronabox.cli"
$NBX --help >/dev/null || { echo "the project does not import here; stopping"; tar -czf "$OUT/results.tar.gz" -C "$WORK" .; exit 1; }

wanted() { [[ " $STEPS " == *" $1 "* ]]; }

if wanted 3; then
step "3. transcripts on the real driver"
bounded 90 python3 scripts/nccl_record.py --out "$WORK/nccl" --worlds 2,4 --timeout 40
bounded 40 python3 scripts/nccl_verify.py "$WORK/nccl"
fi

{
    echo "# perf on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F)"
    echo
} >"$TABLES"
perf() { # LIMIT NAME ARGS...: one perf run, its table appended to tables.md
    local limit=$1 name=$2; shift 2
    echo "## $name: neuronabox perf $*" >>"$TABLES"
    bounded "$limit" $NBX perf "$@" --backend nccl --device cuda -J "$WORK/$name.json" >"$WORK/$name.txt" 2>&1
    tail -n 40 "$WORK/$name.txt" | tee -a "$TABLES"
    echo >>"$TABLES"
}
if wanted 4; then
step "4. perf --backend nccl --device cuda"
SIZES=(-b 1K -e 64M -f 4 -n 20 -w 5)
for rep in 1 2; do
    if [ $((rep % 2)) = 1 ]; then order="all emu"; else order="emu all"; fi
    for side in $order; do
        if [ "$side" = all ]; then
            perf 50 "table1-all-real-$rep" all_reduce "${SIZES[@]}" --nnodes 2 --all-real
        else
            perf 50 "table1-emulated-$rep" all_reduce "${SIZES[@]}" --nnodes 2 --delay-model zero
        fi
    done
done
fi

if wanted 5; then
step "5. the DDP example under neuronabox torchrun --backend nccl"
for w in 2 8; do
    bounded 60 $NBX torchrun --nnodes "$w" --nproc-per-node 1 --backend nccl --trace "$WORK/ddp-w$w.jsonl" \
        examples/train_ddp.py --steps 5 --backend nccl
done
fi

if wanted 6; then
step "6. emulated worlds"
for w in 8 64; do
    perf 40 "emulated-w$w-all_reduce" all_reduce -b 1K -e 16M -f 16 -n 10 -w 2 --nnodes "$w" --topology ib-100g
done
perf 40 "emulated-w512-all_reduce" all_reduce -b 1K -e 1M -f 32 -n 5 -w 1 --nnodes 512 --topology ib-100g
fi

if wanted 7; then
step "7. the DDP example, every rank real against rank 1 emulated (W = 2), interleaved twice"
for rep in 1 2; do
    for real in 0,1 0; do
        tag=$([ "$real" = 0,1 ] && echo all-real || echo emulated)
        bounded 60 $NBX torchrun --nnodes 2 --nproc-per-node 1 --real-nodes "$real" --backend nccl --delay-model zero \
            --trace "$WORK/ddp-$tag-$rep.jsonl" examples/train_ddp.py --steps 30 --backend nccl >"$WORK/ddp-$tag-$rep.txt" 2>&1
        grep -E "^step|iteration|error" "$WORK/ddp-$tag-$rep.txt" | tail -n 12 | sed "s/^/$tag-$rep: /"
    done
done
fi

fidelity() { # LIMIT ARGS...: scripts/fidelity.py, its rows appended to tables.md
    local limit=$1; shift
    echo "## scripts/fidelity.py $*" >>"$TABLES"
    bounded "$limit" python3 scripts/fidelity.py --out "$WORK/fidelity" "$@" | tee -a "$TABLES"
}
RT=()
if chrt -f 1 true 2>/dev/null; then RT=(--realtime); else echo "no real-time class here: validate without --realtime"; fi
if wanted 8; then
step "8. validate, loopback W = 2, six workloads, 5 repetitions (${RT[*]:-normal class})"
python3 -c 'import lightning, transformers, accelerate; print("lightning", lightning.__version__, "transformers", transformers.__version__)'
fidelity 420 --only loopback --repeat 5 "${RT[@]}"
fi
if wanted 9; then
step "9. validate, netns W = 4 at 1 Gbit, six workloads, 5 repetitions"
if ip netns add nbx-probe 2>/dev/null && ip netns del nbx-probe && tc -V >/dev/null 2>&1; then
    fidelity 420 --only netns --nnodes 4 --rate 1gbit --repeat 5
else
    echo "no network namespaces or tc here: step 9 skipped"
fi
fi

step "done: packing"
tar -czf "$OUT/results.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT"
