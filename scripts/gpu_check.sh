#!/usr/bin/env bash
# The GPU check: one command that proves hvd-dynbatch on a GPU node, also one without network.
#
#   bash scripts/gpu_check.sh              on the GPU node
#   bash scripts/gpu_check.sh --rehearse   anywhere: every step that needs no CUDA (the suite
#                                          runs it), the others listed as skipped
#
# Before, on a machine with network (or let the check do it where the node has network):
#   bash scripts/setup.sh --fetch          the Horovod sdist into .offline/ (3.5 MB)
# and, for the plain-Horovod baseline, Horovod's own benchmark script beside it:
#   .offline/pytorch_synthetic_benchmark.py   (examples/pytorch/ of horovod/horovod v0.28.1)
# then bring the repository with .offline/ to the node.
#
# The node's python3 (HVD_DYNBATCH_PYTHON) must have torch with CUDA, numpy, mpi4py, click,
# psutil, tqdm, Pillow, matplotlib, pytest and a C++ compiler with CMake: the set-up
# (setup.sh --offline, no index reachable) makes .venv-gpu on top of it (HVD_DYNBATCH_VENV),
# builds Horovod with NCCL and Gloo against that torch (MPI too where mpicc is there) and
# installs this package without dependencies. Then, each step timed, its output logged:
# horovodrun --check-build, hvd-dynbatch check, the step clock against
# torch.cuda.synchronize (benchmarks/step_clock.py), the CNN on the digits to 90% in bf16 and
# in fp16, ResNet-50 at 224 px in bf16 (channels_last, cudnn.benchmark) through
# benchmarks/throughput.py and through Horovod's script, two ranks sharing the GPU with a
# 1,3 slowdown (static against dynamic batching), and the suite's GPU tests and launched
# tests. A short table comes last; the full log goes to $HVD_DYNBATCH_CHECK_DIR (default
# ./gpu-check). Exit 0 when every step that ran passed, 1 otherwise, 2 where there is no GPU.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REHEARSE=0
case "${1:-}" in
    --rehearse) REHEARSE=1 ;;
    "") ;;
    *) echo "gpu_check: unknown option $1: use --rehearse or nothing" >&2; exit 2 ;;
esac
if [ "$REHEARSE" = 0 ] && ! (nvidia-smi -L 2>/dev/null || true) | grep -q '^GPU '; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none); this script checks a GPU" \
         "node. Elsewhere, 'bash scripts/gpu_check.sh --rehearse' runs the steps that need" \
         "no GPU, and 'make test' the suite." >&2
    exit 2
fi

out=$(mkdir -p "${HVD_DYNBATCH_CHECK_DIR:-gpu-check}" && cd "${HVD_DYNBATCH_CHECK_DIR:-gpu-check}" && pwd)
log="$out/gpu-check-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ).log"
export HVD_DYNBATCH_VENV=${HVD_DYNBATCH_VENV:-$ROOT/.venv-gpu}
OFFLINE_DIR=${HVD_DYNBATCH_OFFLINE_DIR:-$ROOT/.offline}
export HVD_DYNBATCH_OFFLINE_DIR=$OFFLINE_DIR
exec > >(tee -a "$log") 2>&1
cd "$ROOT"

rows=() failed=0
# step NAME CUDA(0/1) COMMAND...: run COMMAND, timed and logged, unless it needs CUDA in a
# rehearsal; its row goes into the table.
step() {
    local name=$1 cuda=$2 began status
    shift 2
    if [ "$REHEARSE" = 1 ] && [ "$cuda" = 1 ]; then
        rows+=("| $name | skipped (rehearsal: needs CUDA) | |")
        return
    fi
    printf '\n== %s (%s)\n' "$name" "$(date -u +%H:%M:%S)"
    began=$(date +%s.%N)
    "$@"
    status=$?
    local seconds
    seconds=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$status" = 0 ]; then
        rows+=("| $name | passed | $seconds |")
    else
        rows+=("| $name | FAILED (exit $status) | $seconds |")
        failed=1
    fi
}

fetch() {
    [ -f "$OFFLINE_DIR/horovod-0.28.1.tar.gz" ] && { echo "the sdist is in $OFFLINE_DIR"; return; }
    bash scripts/setup.sh --fetch
}

# The set-up with no package index reachable: what the node has, and nothing from outside.
offline_setup() {
    PIP_NO_INDEX=1 PIP_INDEX_URL=http://127.0.0.1:9/simple bash scripts/setup.sh --offline
}

py() { "$HVD_DYNBATCH_VENV/bin/python" "$@"; }
on_path() { PATH="$HVD_DYNBATCH_VENV/bin:$PATH" "$@"; }

what_torch_sees() {
    py - <<'EOF'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}")
raise SystemExit(0 if torch.cuda.is_available() else "torch sees no GPU")
EOF
}

# A one-rank run of the CNN on the digits in precision $1, to 90% test accuracy.
to_ninety() {
    on_path horovodrun -np 1 -H localhost:1 hvd-dynbatch train --model cnn --dataset digits \
        --global-batch 256 --epochs 30 --eval-every 20 --target-accuracy 0.9 --device cuda \
        --amp "$1" --no-progress --metrics "$out/digits-$1.jsonl" || return 1
    py - "$out/digits-$1.jsonl" <<'EOF'
import json, sys
s = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(json.dumps({k: s[k] for k in ("device", "final_accuracy", "time_to_target",
                                    "skipped_steps", "overflow_steps")}))
sys.exit(0 if s["final_accuracy"] >= 0.9 else "did not reach 90%")
EOF
}

resnet50_throughput() {
    on_path horovodrun -np 1 -H localhost:1 python benchmarks/throughput.py --model resnet50 \
        --image-size 224 --global-batch 64 --steps 60 --device cuda --amp bf16 \
        --channels-last --cudnn-benchmark
}

# Horovod's own benchmark (its DistributedOptimizer, float32, NCHW: its script has no bf16),
# same model and batch, same build.
horovod_baseline() {
    on_path horovodrun -np 1 -H localhost:1 python "$OFFLINE_DIR/pytorch_synthetic_benchmark.py" \
        --model resnet50 --batch-size 64
}

# Two ranks sharing one device, the second emulated 3x slower: static, then dynamic batching.
shared_device() {
    local device=$1 model=$2 steps=$3
    on_path python benchmarks/throughput.py --local 2 --batching static dynamic \
        --slowdown 1,3 --device "$device" --model "$model" --global-batch 128 --steps "$steps"
}

suite() {
    on_path python -m pytest -p no:cacheprovider --timeout 300 "$@"
}

step "download the Horovod sdist (once, with network)" 0 fetch
step "set-up with no index reachable (Horovod build)" 0 offline_setup
step "what torch sees" 1 what_torch_sees
# (The set-up has refused a build without NCCL on a GPU node; this step puts the list in the log.)
step "horovodrun --check-build" 0 on_path horovodrun --check-build
step "hvd-dynbatch check, 2 ranks (Gloo)" 0 on_path horovodrun --gloo -np 2 -H localhost:2 hvd-dynbatch check
step "step clock against torch.cuda.synchronize" 1 on_path python benchmarks/step_clock.py
step "CNN on the digits to 90%, --amp bf16" 1 to_ninety bf16
step "CNN on the digits to 90%, --amp fp16" 1 to_ninety fp16
step "throughput.py: ResNet-50, 224 px, bf16, channels_last" 1 resnet50_throughput
if [ -f "$OFFLINE_DIR/pytorch_synthetic_benchmark.py" ] || [ "$REHEARSE" = 1 ]; then
    step "Horovod's pytorch_synthetic_benchmark.py, ResNet-50" 1 horovod_baseline
else
    rows+=("| Horovod's pytorch_synthetic_benchmark.py | not run: not brought to $OFFLINE_DIR | |")
fi
if [ "$REHEARSE" = 1 ]; then
    step "2 ranks on one device (CPU), 1,3: static vs dynamic" 0 shared_device cpu linear 6
else
    step "2 ranks sharing the GPU, 1,3: static vs dynamic" 1 shared_device cuda:0 resnet18 60
fi
step "the suite's GPU tests" 1 suite -m gpu tests
step "the suite's launched tests (${HVD_DYNBATCH_CHECK_TESTS:-training, amp, device})" 1 \
    suite -m processes ${HVD_DYNBATCH_CHECK_TESTS:-tests/test_training.py tests/test_amp.py tests/test_device.py}

printf '\n== the GPU check%s on %s, %s\n\n' "$([ "$REHEARSE" = 1 ] && echo ' (rehearsal)')" \
    "$(hostname)" "$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo 'no GPU') | head -1)"
echo "| step | result | seconds |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "full log: $log"
exit "$failed"
