#!/usr/bin/env bash
# Run every benchmark on this machine and write benchmarks/RESULTS.md from what they print
# (each prints its report on stdout and its progress on stderr), with the PNG plots in
# benchmarks/plots/. About 45 minutes on 2 cores. Run nothing else meanwhile: the figures
# are timings.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-../.venv/bin/python}
out=RESULTS.md.tmp
rm -rf plots.tmp && mkdir plots.tmp
{
    echo "# Benchmark results"
    echo
    echo "Written by \`benchmarks/run_all.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); every figure"
    echo "below is from that run. Ranks are emulated on one machine (\`--slowdown\`), one"
    echo "compute thread each; timings on a shared 2-core machine vary by several percent"
    echo "from run to run, so compare figures within one table. Plots are at the end."
} >"$out"

# section TITLE COMMAND...: run COMMAND here and append its output under a heading.
section() {
    local title=$1
    shift
    echo "running $title: $* ..." >&2
    {
        echo
        echo "## $title"
        echo
        echo "\`$(printf '%q ' "$@" | sed 's/ $//')\`" |
            sed 's|\.\./\.venv/bin/python|python|; s|plots\.tmp|plots|g'
        echo
        "$@"
    } >>"$out"
}

section "Simulator for scale" "$PY" -m hvd_dynbatch simulate \
    --events "10:slow=0.1@2;20:leave=0.25;30:join=0.25" --adjustments 40
section "Throughput" "$PY" throughput.py --local 2 --model cnn --preset HL4 \
    --global-batch 256 --steps 40 --batching static dynamic
section "Speedup" "$PY" speedup.py
section "Settling" "$PY" settling.py
section "Overhead" "$PY" overhead.py
section "Emulator fidelity" "$PY" emulator_fidelity.py
section "Time to accuracy" "$PY" time_to_accuracy.py
section "Comparison matrix" "$PY" matrix.py --plots plots.tmp
section "ImageNet subset" "$PY" imagenet_subset.py
section "Elastic learning-rate rules" "$PY" elastic_lr.py --plots plots.tmp
section "ABS-SGD" "$PY" abs_compare.py
section "Checkpoints" "$PY" checkpoint_cost.py
section "Stops" "$PY" stops.py

{
    echo
    echo "## Plots"
    for png in plots.tmp/*.png; do
        name=$(basename "$png" .png)
        echo
        echo "![$name](plots/$name.png)"
    done
} >>"$out"
rm -rf plots && mv plots.tmp plots
mv "$out" RESULTS.md
echo "wrote benchmarks/RESULTS.md and benchmarks/plots/" >&2
