#!/usr/bin/env bash
# Idempotent set-up of a development environment for hvd-dynbatch on a Debian machine:
#   1. Open MPI (and a C++ toolchain with cmake) from Debian when missing;
#   2. a virtual environment in .venv with torch 2.13.0 (CPU), mpi4py, numpy, click, ...;
#   3. Horovod 0.28.1 with PyTorch, MPI and Gloo, built once from the PyPI sdist with the
#      C++17 fix (its CMake pins C++14, torch >= 2.1 needs C++17) and cached as a wheel
#      outside the clone, keyed by the Horovod, torch and Python versions;
#   4. this package in editable mode;
#   5. a check that `horovodrun --check-build` lists PyTorch, MPI and Gloo.
# On a machine with an NVIDIA GPU (nvidia-smi lists one; HVD_DYNBATCH_GPU=0 or 1 overrides)
# torch is PyPI's CUDA build instead, and Horovod is built with NCCL for the GPU operations,
# against the machine's CUDA toolkit (CUDA_HOME, or nvcc on PATH) or, where there is none,
# one assembled from NVIDIA's PyPI packages; its check must then list NCCL too.
# With --test (as `make test` runs it) it also installs Slurm and munge from Debian, for the
# suite's one-node Slurm cluster.
# With --offline (a node without network, as scripts/gpu_check.sh runs it) nothing is
# downloaded: the virtual environment sees the Python packages of the python3 it is made
# from (its torch, CUDA build or not, and Horovod's own dependencies), Horovod is built from
# the sdist that `--fetch` put in .offline/ beforehand, with MPI only where an MPI compiler is
# there (Gloo alone otherwise), and this package is installed without its dependencies.
# --fetch, on a machine with network, downloads that sdist and returns.
# A second run on a ready machine only verifies and returns within seconds.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_DYNBATCH_VENV:-$ROOT/.venv}
CACHE=${HVD_DYNBATCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvd-dynbatch}
PY=$VENV/bin/python
# The Python the environment is made from (offline: whose packages it uses).
BASE_PYTHON=${HVD_DYNBATCH_PYTHON:-python3}

# pip, without the warnings some machines' pip configuration prints for every package.
run_pip() { "$PY" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
say() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# The Horovod sdist for an offline set-up: `--fetch` puts it here, `--offline` builds it.
OFFLINE_DIR=${HVD_DYNBATCH_OFFLINE_DIR:-$ROOT/.offline}

FOR_TESTS=0 OFFLINE=0
case "${1:-}" in
    --test) FOR_TESTS=1 ;;       # also what the test suite needs from Debian
    --offline) OFFLINE=1 ;;
    --fetch)
        mkdir -p "$OFFLINE_DIR"
        "$BASE_PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$OFFLINE_DIR" \
            "horovod==$HOROVOD_VERSION" || die "could not download the Horovod $HOROVOD_VERSION sdist"
        say "the Horovod sdist is in $OFFLINE_DIR: bring that folder with the repository"
        exit 0 ;;
    "") ;;
    *) die "unknown option $1: use --test, --offline or --fetch" ;;
esac

# 1 where this machine trains on NVIDIA GPUs.
GPU=${HVD_DYNBATCH_GPU:-$( (nvidia-smi -L 2>/dev/null || true) | grep -q '^GPU ' && echo 1 || echo 0)}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run: $* (install these Debian packages by hand, then run again)"
    fi
}

system_packages() {
    if [ "$OFFLINE" = 1 ]; then
        command -v cmake >/dev/null || die "cmake is not here (needed to build Horovod), and offline nothing can be installed"
        command -v c++ >/dev/null || die "no C++ compiler (c++) here (needed to build Horovod), and offline nothing can be installed"
        have_mpi || say "Horovod is built without MPI, with Gloo alone (no mpicc here, or HVD_DYNBATCH_MPI=0)"
        return
    fi
    local missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++ >/dev/null || missing+=(g++)
    if [ "$FOR_TESTS" = 1 ]; then
        # The suite's one-node Slurm cluster (tests/slurm.py).
        command -v slurmctld >/dev/null || missing+=(slurmctld)
        command -v slurmd >/dev/null || missing+=(slurmd)
        command -v sbatch >/dev/null || missing+=(slurm-client)
        command -v munged >/dev/null || missing+=(munge)
    fi
    [ ${#missing[@]} -eq 0 ] && return
    say "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

# Whether Horovod is built with MPI: where an MPI compiler is here (the set-up installs Open
# MPI's where it may); HVD_DYNBATCH_MPI=0 or 1 overrides.
have_mpi() {
    case "${HVD_DYNBATCH_MPI:-}" in
        0) return 1 ;;
        1) return 0 ;;
        *) command -v mpicc >/dev/null ;;
    esac
}

python_packages() {
    # The stamp records what the last successful install was made from, so a ready
    # environment skips pip entirely.
    local want stamp=$VENV/.hvd-dynbatch-deps
    want=$( (cat "$ROOT/setup.cfg" "$ROOT/scripts/setup.sh"; echo "gpu=$GPU offline=$OFFLINE") | sha256sum | cut -d' ' -f1)
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
    if [ "$OFFLINE" = 1 ]; then
        offline_packages
        echo "$want" >"$stamp"
        return
    fi
    say "installing Python packages into $VENV"
    run_pip install -q --upgrade pip setuptools wheel
    run_pip install -q "torch==$TORCH_VERSION" \
        || die "pip could not install torch==$TORCH_VERSION"
    if [ "$GPU" = 1 ] && [ -z "$(torch_cuda)" ]; then
        die "this machine has a GPU but torch $TORCH_VERSION was installed without CUDA; install your site's CUDA build of torch $TORCH_VERSION into $VENV, then run the set-up again"
    fi
    # Horovod's build needs these in the environment (it is built without isolation).
    run_pip install -q cloudpickle psutil pyyaml packaging cffi
    horovod_wheel
    run_pip install -q -e "$ROOT[test]" || die "pip install -e . failed"
    echo "$want" >"$stamp"
}

# Offline: what the environment already has (torch, Horovod's dependencies, the tests'),
# Horovod from the sdist in $OFFLINE_DIR, and this package without its dependencies.
offline_packages() {
    say "offline: using the packages of $BASE_PYTHON ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "no torch"))"
    local missing
    missing=$("$PY" -c '
import importlib.util
need = ["torch", "numpy", "mpi4py", "click", "tqdm", "psutil", "PIL", "matplotlib",
        "cloudpickle", "yaml", "packaging", "setuptools", "pytest", "pytest_timeout"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))')
    [ -z "$missing" ] || die "offline, and these Python packages are not here: $missing (carry them as wheels and pip install --no-index them first)"
    if [ "$GPU" = 1 ] && [ -z "$(torch_cuda)" ]; then
        die "this machine has a GPU but its torch has no CUDA"
    fi
    horovod_wheel
    run_pip install -q --no-index --no-deps --no-build-isolation -e "$ROOT" \
        || die "pip install -e . failed"
}

# A virtual environment that sees python3's packages, also where python3 is itself a
# virtual environment's (--system-site-packages sees only the base installation's): that
# one's site-packages go in through a .pth file.
offline_venv() {
    "$BASE_PYTHON" -m venv --system-site-packages "$VENV" || die "$BASE_PYTHON -m venv failed"
    local parent
    parent=$("$BASE_PYTHON" -c 'import sys, sysconfig
if sys.prefix != sys.base_prefix:
    print("\n".join(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))))')
    [ -z "$parent" ] || echo "$parent" >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/hvd-dynbatch-parent.pth"
}

# The CUDA version torch was built with ("12.8"), empty for a CPU build.
torch_cuda() { "$PY" -c 'import torch; print(torch.version.cuda or "")'; }

horovod_wheel() {
    local ready="assert horovod.__version__ == '$HOROVOD_VERSION'"
    [ "$GPU" = 1 ] && ready="$ready and horovod.torch.nccl_built()"
    # Its own horovodrun too: an offline environment may see a Horovod of its parent's.
    if [ -x "$VENV/bin/horovodrun" ] && "$PY" -c "import horovod, horovod.torch; $ready" 2>/dev/null; then
        return
    fi
    local pyver key dir
    pyver=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    key="horovod-$HOROVOD_VERSION-torch-$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')-$pyver"
    [ "$GPU" = 1 ] && key="$key-cu$(torch_cuda | tr -d .)-nccl"
    have_mpi || key="$key-gloo"
    dir=$CACHE/wheels/$key
    if ! ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
        build_horovod "$dir"
    else
        say "using cached Horovod wheel from $dir"
    fi
    run_pip install -q --no-deps --ignore-installed "$dir"/horovod-*.whl || die "installing the Horovod wheel failed"
}

build_horovod() {
    local out=$1 work
    work=$(mktemp -d)
    say "building Horovod $HOROVOD_VERSION (about 5 minutes on 2 cores; log: $work/build.log)"
    local sdist=$OFFLINE_DIR/horovod-$HOROVOD_VERSION.tar.gz
    if [ "$OFFLINE" = 1 ]; then
        [ -f "$sdist" ] || die "offline, and $sdist is not here: run 'bash scripts/setup.sh --fetch' on a machine with network and bring $OFFLINE_DIR along"
    else
        run_pip download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION" \
            || die "could not download the Horovod $HOROVOD_VERSION sdist"
        sdist=$work/horovod-$HOROVOD_VERSION.tar.gz
    fi
    tar -xzf "$sdist" -C "$work"
    local src=$work/horovod-$HOROVOD_VERSION
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt" \
        || die "the C++17 fix did not apply to $src/horovod/torch/CMakeLists.txt"
    mkdir -p "$out"
    local operations=(HOROVOD_CPU_OPERATIONS=GLOO) cuda nccl
    if [ "$GPU" = 1 ]; then
        cuda=$(cuda_home) || exit 1
        nccl=$(nccl_home) || exit 1
        operations=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
                    "HOROVOD_CUDA_HOME=$cuda" "HOROVOD_NCCL_HOME=$nccl")
    fi
    local mpi=HOROVOD_WITH_MPI=1
    have_mpi || mpi=HOROVOD_WITHOUT_MPI=1
    if ! env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        "$mpi" HOROVOD_WITH_GLOO=1 "${operations[@]}" MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps -w "$work/dist" "$src" >"$work/build.log" 2>&1; then
        tail -30 "$work/build.log" >&2
        die "the Horovod build failed; full log: $work/build.log"
    fi
    mv "$work"/dist/horovod-*.whl "$out"/
    rm -rf "$work"
    say "cached the Horovod wheel in $out"
}

# NVIDIA's PyPI packages for torch's CUDA version: CUDA 12's carry a -cu12 suffix, CUDA 13's
# none (their NCCL: -cu13).
cuda_packages() {
    local version major
    version=$(torch_cuda); major=${version%%.*}
    if [ "$major" -le 12 ]; then
        echo "nvidia-cuda-nvcc-cu$major==$version.* nvidia-cuda-runtime-cu$major==$version.* nvidia-cuda-cccl-cu$major==$version.* nvidia-nccl-cu$major"
    else
        echo "nvidia-cuda-nvcc==$version.* nvidia-cuda-runtime==$version.* nvidia-cuda-cccl==$version.* nvidia-nccl-cu$major"
    fi
}

# The first file named $1 below NVIDIA's packages on the environment's path (an offline
# environment's are its parent's).
nvidia_file() {
    local dirs
    dirs=$("$PY" -c 'import os, sys; print("\n".join(p + "/nvidia" for p in sys.path if os.path.isdir(p + "/nvidia")))')
    [ -n "$dirs" ] || return 0
    # shellcheck disable=SC2086
    find $dirs -name "$1" -print -quit 2>/dev/null
}

# A CUDA toolkit for the build: CUDA_HOME, the one nvcc on PATH belongs to, or one put
# together from NVIDIA's PyPI packages under the cache (nvcc finds its own parts relative to
# its binary, so the headers and libraries are copied beside it, not linked).
cuda_home() {
    if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then echo "$CUDA_HOME"; return; fi
    if command -v nvcc >/dev/null; then dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"; return; fi
    local home=$CACHE/cuda-$(torch_cuda)
    [ -x "$home/bin/nvcc" ] || [ "$OFFLINE" = 0 ] \
        || die "offline, and no CUDA toolkit here (no nvcc on PATH): set CUDA_HOME to one"
    if [ ! -x "$home/bin/nvcc" ]; then
        say "no CUDA toolkit here: assembling one in $home from PyPI ($(cuda_packages))"
        # shellcheck disable=SC2046
        run_pip install -q $(cuda_packages) >&2 || die "pip could not install $(cuda_packages)"
        local nvcc runtime cccl
        nvcc=$(nvidia_file nvcc); runtime=$(nvidia_file cuda_runtime.h); cccl=$(nvidia_file cub)
        [ -n "$nvcc" ] && [ -n "$runtime" ] || die "NVIDIA's packages have no nvcc or cuda_runtime.h"
        rm -rf "$home.tmp" && mkdir -p "$home.tmp/lib64"
        cp -a "$(dirname "$(dirname "$nvcc")")/." "$home.tmp/"
        cp -a "$(dirname "$runtime")/." "$home.tmp/include/"
        [ -n "$cccl" ] && cp -a "$(dirname "$cccl")/." "$home.tmp/include/"
        cp -a "$(dirname "$(dirname "$runtime")")"/lib/. "$home.tmp/lib64/"
        local cudart
        cudart=$(find "$home.tmp/lib64" -name 'libcudart.so.*' -print -quit)
        [ -n "$cudart" ] && ln -sf "$(basename "$cudart")" "$home.tmp/lib64/libcudart.so"
        mv "$home.tmp" "$home"
    fi
    echo "$home"
}

# NCCL's headers and a libnccl.so to link, from the nvidia-nccl package that CUDA torch
# depends on (it ships libnccl.so.2 only).
nccl_home() {
    local header home=$CACHE/nccl-$(torch_cuda)
    header=$(nvidia_file nccl.h)
    if [ -z "$header" ] && [ "$OFFLINE" = 0 ]; then
        # shellcheck disable=SC2046
        run_pip install -q $(cuda_packages | tr ' ' '\n' | grep nccl) >&2
        header=$(nvidia_file nccl.h)
    fi
    [ -n "$header" ] || die "found no nccl.h in NVIDIA's packages; set HOROVOD_NCCL_HOME by hand"
    local lib
    lib=$(find "$(dirname "$(dirname "$header")")/lib" -name 'libnccl.so*' -print -quit)
    mkdir -p "$home/lib"
    ln -sfn "$(dirname "$header")" "$home/include"
    ln -sf "$lib" "$home/lib/libnccl.so"
    echo "$home"
}

check_build() {
    local report
    report=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $report"
    local need
    local needs=(PyTorch Gloo)
    have_mpi && needs+=(MPI)
    [ "$GPU" = 1 ] && needs+=(NCCL)
    for need in "${needs[@]}"; do
        grep -Eq "\[X\] $need\b" <<<"$report" \
            || die "Horovod was built without $need; horovodrun --check-build says:
$report
Remove $CACHE/wheels and .venv, then run the set-up again."
    done
}

system_packages
if [ ! -x "$PY" ]; then
    say "creating the virtual environment $VENV"
    if [ "$OFFLINE" = 1 ]; then
        offline_venv
    else
        "$BASE_PYTHON" -m venv "$VENV" || die "$BASE_PYTHON -m venv failed (on Debian: apt-get install python3-venv)"
    fi
fi
python_packages
check_build
built="PyTorch, Gloo"
have_mpi && built="$built, MPI"
[ "$GPU" = 1 ] && built="$built and NCCL; CUDA $(torch_cuda)"
say "ready: $VENV (Horovod $HOROVOD_VERSION with $built)"
