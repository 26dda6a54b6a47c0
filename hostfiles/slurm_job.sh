# Sourced by the Slurm batch scripts beside it (`source slurm_job.sh "$@"`): the environment
# and the arguments of `hvd-dynbatch train` for this job, in the array TRAIN.
#
# - The environment: $HVD_DYNBATCH_VENV if set, else the .venv that `make setup` made in the
#   repository this folder belongs to; neither there is an error that says what to set.
# - The arguments: those given to sbatch after the script (`sbatch SCRIPT --model cnn ...`),
#   else a short demo run on the embedded digits.
# - Checkpoints and requeue: every start passes --checkpoint-dir (default
#   checkpoints-$SLURM_JOB_ID in the submit directory, or $HVD_DYNBATCH_CHECKPOINTS) and
#   --resume, so a requeued job (Slurm counts its starts in SLURM_RESTART_COUNT; the job id
#   stays) goes on from its newest checkpoint; arguments given to sbatch come after these and
#   win. The ranks write a checkpoint and stop on SIGTERM, which Slurm sends before it kills
#   a job (the scripts ask for it 120 s before the time limit with --signal).
# - Launchers that must not be signalled themselves run under slurm_job_launch (below).
# shellcheck shell=bash

slurm_job_die() { echo "hvd-dynbatch (Slurm job ${SLURM_JOB_ID:-?}): $*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] || slurm_job_die "not inside a Slurm job: submit the script with sbatch"
slurm_job_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
slurm_job_venv=${HVD_DYNBATCH_VENV:-$slurm_job_root/.venv}
[ -x "$slurm_job_venv/bin/hvd-dynbatch" ] || slurm_job_die "no hvd-dynbatch environment in \
$slurm_job_venv: run 'make setup' in $slurm_job_root, or set HVD_DYNBATCH_VENV to the \
environment (sbatch passes your environment on)"
# shellcheck disable=SC1091
source "$slurm_job_venv/bin/activate"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

TRAIN=(--checkpoint-dir "${HVD_DYNBATCH_CHECKPOINTS:-$SLURM_SUBMIT_DIR/checkpoints-$SLURM_JOB_ID}"
       --resume)
if [ $# -gt 0 ]; then
    TRAIN+=("$@")
else
    TRAIN+=(--dataset digits --model mlp --global-batch 256 --epochs 5 --batching dynamic
            --metrics "metrics-$SLURM_JOB_ID.jsonl")
fi
echo "hvd-dynbatch: Slurm job $SLURM_JOB_ID, start $((${SLURM_RESTART_COUNT:-0} + 1)), on $SLURM_JOB_NODELIST"

# slurm_job_launch LAUNCHER ARGS...: runs the launcher and exits with its status, passing a
# SIGTERM to the batch shell (`scancel --batch`, --signal=B:) to the training processes on
# this node instead of to the launcher; ranks on other nodes learn of it at the next timing
# exchange. Signalled themselves, horovodrun --gloo SIGKILLs its ranks 5 s later and, as two
# of its threads reap the same shell, can report a stopped rank's status 2 as 0; mpirun
# SIGKILLs them after twice odls_base_sigkill_timeout and stops passing their output on.
# Before any training process is up, the launcher gets the signal.
slurm_job_launch() {
    "$@" &
    slurm_job_launcher=$!
    trap slurm_job_pass_term TERM
    local status=0
    wait "$slurm_job_launcher" || status=$?
    # A trapped signal ends `wait` early: wait again, for the launcher's own status.
    while kill -0 "$slurm_job_launcher" 2>/dev/null; do
        status=0
        wait "$slurm_job_launcher" || status=$?
    done
    exit "$status"
}

slurm_job_pass_term() {
    local pid ranks=()
    for pid in $(slurm_job_descendants "$slurm_job_launcher"); do
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = hvd-dynbatch ]; then ranks+=("$pid"); fi
    done
    if [ ${#ranks[@]} -gt 0 ]; then
        echo "hvd-dynbatch: SIGTERM passed to the ${#ranks[@]} training processes on" \
            "$(hostname)" >&2
        kill -TERM "${ranks[@]}" 2>/dev/null || true
    else
        kill -TERM "$slurm_job_launcher" 2>/dev/null || true
    fi
}

slurm_job_descendants() {
    local child
    for child in $(pgrep -P "$1"); do
        echo "$child"
        slurm_job_descendants "$child"
    done
}
