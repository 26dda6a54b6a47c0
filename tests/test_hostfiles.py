"""The example launch files in hostfiles/ are valid for the tools that read them."""
import re
import subprocess
from pathlib import Path

import pytest
from horovod.runner.common.util.hosts import parse_host_files

HOSTFILES = Path(__file__).resolve().parent.parent / "hostfiles"
HOST_SLOTS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*:[1-9][0-9]*$")


def test_horovodrun_hostfile_parses():
    # Horovod's own parser, which takes no comments or blank lines.
    hosts = parse_host_files(str(HOSTFILES / "horovodrun.hosts"))
    assert hosts == "node01:4,node02:2,node03:2"


def test_openmpi_hostfile_lines_are_valid():
    entry = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*( slots=[1-9][0-9]*)?( max_slots=[1-9][0-9]*)?$")
    lines = [line.strip() for line in (HOSTFILES / "openmpi.hosts").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines
    assert all(entry.match(line) for line in lines), lines


def _discover(env_file):
    env = {"PATH": "/usr/bin:/bin"}
    if env_file is not None:
        env["HVD_DYNBATCH_HOSTS_FILE"] = str(env_file)
    out = subprocess.run([str(HOSTFILES / "discover_hosts.sh")], env=env,
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.processes
def test_discovery_script_reads_the_hosts_file(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# workers now\nlocalhost:3\n\n  other-node:1 \n")
    assert _discover(hosts) == ["localhost:3", "other-node:1"]
    hosts.write_text("localhost:1\n")
    assert _discover(hosts) == ["localhost:1"]


@pytest.mark.processes
@pytest.mark.parametrize("hosts_file", [None, HOSTFILES / "elastic_hosts.txt"])
def test_discovery_script_prints_valid_lines(hosts_file):
    lines = _discover(hosts_file)
    assert lines and all(HOST_SLOTS.match(line) for line in lines), lines


@pytest.mark.processes
@pytest.mark.parametrize("script", ["slurm_mpirun.sbatch", "slurm_horovodrun.sbatch"])
def test_slurm_scripts_are_valid_bash(script):
    path = HOSTFILES / script
    assert subprocess.run(["bash", "-n", str(path)], timeout=10).returncode == 0
    assert "#SBATCH --nodes" in path.read_text()
