"""The `hvd-dynbatch` command: a thin click layer over the library.

Every command that runs inside a launcher (`check`, `train`) is started once per rank by
horovodrun, mpirun or srun; `demo` starts such a job on this machine itself.
"""
from __future__ import annotations

import json
import sys

import click

from .errors import DynBatchError


class _Group(click.Group):
    """Turns a `DynBatchError` into a one-line error and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DynBatchError as exc:
            click.echo(f"hvd-dynbatch: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="hvd-dynbatch")
def main():
    """Data-parallel training with Horovod on workers that are not alike."""


@main.command()
def check():
    """Check the stack under a launcher: each rank prints its view of the job as JSON."""
    from .check import run_check

    click.echo(json.dumps(run_check(), sort_keys=True))


@main.command()
@click.option("--np", "np_", default=2, show_default=True, help="Ranks to start on this machine.")
def demo(np_):
    """Start a small job on this machine and show what every rank sees."""
    from .launch import Launcher, run_local

    for launcher in (Launcher.GLOO, Launcher.MPI):
        click.echo(f"== {np_} ranks under horovodrun --{launcher.value}")
        job = run_local(launcher, np_, [sys.executable, "-m", "hvd_dynbatch", "check"],
                        timeout=120, capture=False)
        if job.returncode != 0:
            raise DynBatchError(f"the {launcher.value} job failed with exit code {job.returncode}")
