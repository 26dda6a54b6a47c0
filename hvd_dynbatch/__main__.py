"""`python -m hvd_dynbatch` runs the CLI."""
from .tools.cli import main

main()
