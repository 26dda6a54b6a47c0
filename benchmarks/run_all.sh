#!/usr/bin/env bash
# Run every benchmark on this machine and write benchmarks/RESULTS.md from what they print
# (each prints its report on stdout and its progress on stderr).
# About 20 minutes on 2 cores. Run nothing else meanwhile: the figures are timings.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-../.venv/bin/python}
out=RESULTS.md.tmp
{
    echo "# Benchmark results"
    echo
    echo "Written by \`benchmarks/run_all.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'); every figure"
    echo "below is from that run. Ranks are emulated on one machine (\`--slowdown\`), one"
    echo "compute thread each; timings on a shared 2-core machine vary by several percent"
    echo "from run to run, so compare figures within one table."
} >"$out"
for bench in speedup settling overhead time_to_accuracy elastic_lr abs_compare; do
    echo "running $bench.py ..." >&2
    {
        echo
        echo "## $bench"
        echo
        echo "\`python benchmarks/$bench.py\`"
        echo
        "$PY" "$bench.py"
    } >>"$out"
done
mv "$out" RESULTS.md
echo "wrote benchmarks/RESULTS.md" >&2
