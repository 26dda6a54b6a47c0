import os
import sys
from pathlib import Path

import pytest

# The helpers in tests/ (launcher.py) are imported as plain modules.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm cluster on localhost for the session (see tests/slurm.py); the set-up
    of `make test` installs its packages, and a machine without them fails here, not skips."""
    from hvd_dynbatch.tools.launch import local_env
    from slurm import PACKAGES, Cluster, missing

    absent = missing()
    if absent:
        pytest.fail(f"Slurm is not installed here ({', '.join(absent)} missing): run "
                    f"'make test', whose set-up installs {' '.join(PACKAGES)}", pytrace=False)
    cluster = Cluster(tmp_path_factory.mktemp("slurm"), cpus=os.cpu_count() or 2)
    cluster.env.update(local_env())
    cluster.env["SLURM_CONF"] = str(cluster.conf)
    cluster.start()
    yield cluster
    cluster.stop()
