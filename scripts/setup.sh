#!/usr/bin/env bash
# Idempotent set-up of a development environment for hvd-dynbatch on a Debian machine:
#   1. Open MPI (and a C++ toolchain with cmake) from Debian when missing;
#   2. a virtual environment in .venv with torch 2.13.0 (CPU), mpi4py, numpy, click, ...;
#   3. Horovod 0.28.1 with PyTorch, MPI and Gloo, built once from the PyPI sdist with the
#      C++17 fix (its CMake pins C++14, torch >= 2.1 needs C++17) and cached as a wheel
#      outside the clone, keyed by the Horovod, torch and Python versions;
#   4. this package in editable mode;
#   5. a check that `horovodrun --check-build` lists PyTorch, MPI and Gloo.
# A second run on a ready machine only verifies and returns within seconds.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_DYNBATCH_VENV:-$ROOT/.venv}
CACHE=${HVD_DYNBATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-dynbatch}
PY=$VENV/bin/python

# pip, without the warnings some machines' pip configuration prints for every package.
run_pip() { "$PY" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $* (install these Debian packages by hand, then run again)"
    fi
}

system_packages() {
    local missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++ >/dev/null || missing+=(g++)
    [ ${#missing[@]} -eq 0 ] && return
    say "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

python_packages() {
    # The stamp records what the last successful install was made from, so a ready
    # environment skips pip entirely.
    local want stamp=$VENV/.hvd-dynbatch-deps
    want=$(cat "$ROOT/setup.cfg" "$ROOT/scripts/setup.sh" | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
    say "installing Python packages into $VENV"
    run_pip install -q --upgrade pip setuptools wheel
    run_pip install -q "torch==$TORCH_VERSION" \
        || die "pip could not install torch==$TORCH_VERSION"
    # Horovod's build needs these in the environment (it is built without isolation).
    run_pip install -q cloudpickle psutil pyyaml packaging cffi
    horovod_wheel
    run_pip install -q -e "$ROOT[test]" || die "pip install -e . failed"
    echo "$want" >"$stamp"
}

horovod_wheel() {
    if "$PY" -c "import horovod, horovod.torch; assert horovod.__version__ == '$HOROVOD_VERSION'" 2>/dev/null; then
        return
    fi
    local pyver key dir
    pyver=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    key="horovod-$HOROVOD_VERSION-torch-$TORCH_VERSION-$pyver"
    dir=$CACHE/wheels/$key
    if ! ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
        build_horovod "$dir"
    else
        say "using cached Horovod wheel from $dir"
    fi
    run_pip install -q --no-deps "$dir"/horovod-*.whl || die "installing the Horovod wheel failed"
}

build_horovod() {
    local out=$1 work
    work=$(mktemp -d)
    say "building Horovod $HOROVOD_VERSION (about 5 minutes on 2 cores; log: $work/build.log)"
    run_pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION" \
        || die "could not download the Horovod $HOROVOD_VERSION sdist"
    tar -xzf "$work"/horovod-*.tar.gz -C "$work"
    local src=$work/horovod-$HOROVOD_VERSION
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
        || die "the C++17 fix did not apply to $src/horovod/torch/CMakeLists.txt"
    mkdir -p "$out"
    if ! HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j2 \
        run_pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1; then
        tail -30 "$work/build.log" >&2
        die "the Horovod build failed; full log: $work/build.log"
    fi
    mv "$work"/dist/horovod-*.whl "$out"/
    rm -rf "$work"
    say "cached the Horovod wheel in $out"
}

check_build() {
    local report
    report=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $report"
    local need
    for need in PyTorch MPI Gloo; do
        grep -Eq "\[X\] $need\b" <<<"$report" \
            || die "Horovod was built without $need; horovodrun --check-build says:
$report
Remove $CACHE/wheels and .venv, then run the set-up again."
    done
}

system_packages
if [ ! -x "$PY" ]; then
    say "creating the virtual environment $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
python_packages
check_build
say "ready: $VENV (Horovod $HOROVOD_VERSION with PyTorch, MPI and Gloo)"
