"""The GPU check script (scripts/gpu_check.sh): its stop where there is no GPU, and its
rehearsal, which runs every step that needs no CUDA (the download, the set-up with no package
index reachable, the launches, the table) so the script is proven before it meets a GPU."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.sh"
# The script's own test of a GPU node.
NVIDIA_GPU = bool(shutil.which("nvidia-smi")) and subprocess.run(
    ["nvidia-smi", "-L"], capture_output=True, text=True).stdout.startswith("GPU ")


@pytest.mark.processes
@pytest.mark.skipif(NVIDIA_GPU, reason="nvidia-smi lists a GPU here")
def test_the_gpu_check_script_stops_at_once_where_there_is_no_gpu(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HVD_DYNBATCH_CHECK_DIR": str(tmp_path / "out")})
    assert done.returncode == 2, done
    assert done.stderr.startswith("gpu_check: no NVIDIA GPU here") and not done.stdout
    assert not (tmp_path / "out").exists()   # nothing set up, nothing written


@pytest.mark.processes
def test_the_rehearsal_sets_up_offline_runs_each_step_without_cuda_and_tables_them(tmp_path):
    # The project's environment stands in for the node's python3: the rehearsal's environment
    # is made on top of it and finds Horovod's wheel in the cache the set-up filled.
    out = tmp_path / "out"
    env = {**os.environ, "HVD_DYNBATCH_PYTHON": sys.executable,
           "HVD_DYNBATCH_VENV": str(tmp_path / "venv"),
           "HVD_DYNBATCH_OFFLINE_DIR": str(tmp_path / "offline"),
           "HVD_DYNBATCH_CHECK_DIR": str(out)}
    done = subprocess.run(["bash", str(SCRIPT), "--rehearse"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert (tmp_path / "offline" / "horovod-0.28.1.tar.gz").is_file()
    assert (tmp_path / "venv" / "bin" / "horovodrun").is_file()   # its own, not its parent's

    table = dict(re.findall(r"^\| (.+?) \| (passed|skipped \(rehearsal: needs CUDA\)|FAILED.*?) \|",
                            done.stdout, re.M))
    ran = {name for name, result in table.items() if result == "passed"}
    assert {"download the Horovod sdist (once, with network)",
            "set-up with no index reachable (Horovod build)", "horovodrun --check-build",
            "hvd-dynbatch check, 2 ranks (Gloo)",
            "2 ranks on one device (CPU), 1,3: static vs dynamic"} == ran, table
    assert "skipped (rehearsal: needs CUDA)" == table["step clock against torch.cuda.synchronize"]
    assert len(table) == 13, table

    # The check's own output: the set-up said it used what was there, the 2-rank job ran, and
    # dynamic batching moved the split off the even one.
    assert "offline: using the packages of" in done.stdout
    assert "[X] PyTorch" in done.stdout and "[X] Gloo" in done.stdout
    assert '"size": 2' in done.stdout
    static, dynamic = (re.search(rf"^\| {name} +\|.*\| (\d+),(\d+) +\|$", done.stdout, re.M)
                       for name in ("static", "dynamic"))
    assert (int(static[1]), int(static[2])) == (64, 64)
    assert int(dynamic[1]) > int(dynamic[2]), dynamic[0]   # the fast rank took more
    logs = list(out.glob("gpu-check-*.log"))
    assert len(logs) == 1 and "| step | result | seconds |" in logs[0].read_text()
