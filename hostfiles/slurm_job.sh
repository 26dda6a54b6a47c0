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
