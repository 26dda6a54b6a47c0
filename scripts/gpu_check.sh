#!/usr/bin/env bash
# One command that checks hvd-dynbatch on a GPU machine, every GPU of this node one rank:
#   1. the set-up (scripts/setup.sh: CUDA torch, Horovod with NCCL) and what torch sees;
#   2. `horovodrun --check-build` (must list NCCL) and `hvd-dynbatch check`;
#   3. short dynamic-batching runs of the CNN on the digits to 90% with --amp bf16 and fp16;
#   4. benchmarks/throughput.py in bf16 with channels_last and cudnn.benchmark (ResNet-18);
#   5. the equivalence property in float32: the ranks end with the weights of one rank.
# Everything it prints also goes to gpu-check-HOST-DATE.log, for RESULTS.md's GPU section.
# Where there is no NVIDIA GPU it stops at once with exit 2 and says so.
#
#   bash scripts/gpu_check.sh [OUTPUT_DIR]      (default: ./gpu-check)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
if [ "$gpus" -lt 1 ]; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi lists none); this script checks a GPU" \
         "machine. On a CPU machine, 'make test' runs the suite." >&2
    exit 2
fi

out=$(mkdir -p "${1:-gpu-check}" && cd "${1:-gpu-check}" && pwd)
log="$out/gpu-check-$(hostname)-$(date -u +%Y%m%dT%H%M%SZ).log"
exec > >(tee -a "$log") 2>&1
step() { printf '\n== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "gpu_check: FAILED: $*"; exit 1; }

step "set-up"
bash "$ROOT/scripts/setup.sh"
# shellcheck disable=SC1091
source "$ROOT/.venv/bin/activate"
cd "$ROOT"
python - <<'EOF'
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
for i in range(torch.cuda.device_count()):
    print(f"GPU {i}: {torch.cuda.get_device_name(i)}")
assert torch.cuda.is_available(), "torch sees no GPU"
EOF
hvd() { horovodrun -np "$gpus" -H "localhost:$gpus" "$@"; }

step "horovodrun --check-build"
build=$(horovodrun --check-build)
echo "$build"
grep -Eq '\[X\] NCCL' <<<"$build" || fail "Horovod was built without NCCL"

step "hvd-dynbatch check on $gpus ranks"
hvd hvd-dynbatch check

summary() {
    python - "$1" <<'EOF'
import json, sys
s = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(json.dumps({k: s[k] for k in ("device", "samples_per_sec", "final_accuracy",
                                    "time_to_target", "final_split", "skipped_steps",
                                    "overflow_steps", "weights_identical")}))
ok = s["final_accuracy"] >= 0.9 and s["weights_identical"]
sys.exit(0 if ok else 1)
EOF
}
for amp in bf16 fp16; do
    step "dynamic batching, --amp $amp, $gpus ranks, CNN on the digits to 90%"
    hvd hvd-dynbatch train --model cnn --dataset digits --global-batch 256 --epochs 30 \
        --eval-every 20 --target-accuracy 0.9 --device cuda --amp "$amp" --no-progress \
        --metrics "$out/dynamic-$amp.jsonl"
    summary "$out/dynamic-$amp.jsonl" || fail "the $amp run did not reach 90% with equal weights"
done

step "throughput: ResNet-18, synthetic, bf16, channels_last, cudnn.benchmark"
hvd python benchmarks/throughput.py --model resnet18 --global-batch $((64 * gpus)) \
    --steps 60 --device cuda --amp bf16 --channels-last --cudnn-benchmark

step "equivalence: $gpus ranks against one, float32, MLP on the digits"
common=(--model mlp --dataset digits --global-batch 64 --max-steps 30 --device cuda
        --batching dynamic --no-progress)
hvd hvd-dynbatch train "${common[@]}" --save-model "$out/n.pt"
hvd-dynbatch train "${common[@]}" --save-model "$out/one.pt"
python - "$out/n.pt" "$out/one.pt" <<'EOF'
import sys, torch
n, one = (torch.load(p, map_location="cpu") for p in sys.argv[1:])
worst = max((n[k] - one[k]).abs().max().item() for k in n)
print(f"largest weight difference, {sys.argv[1]} against {sys.argv[2]}: {worst:.3g}")
sys.exit(0 if worst < 1e-4 else 1)
EOF
[ "$gpus" -gt 1 ] || echo "(one GPU: the equivalence is of one rank with itself)"

step "all checks passed; the log is $log"
