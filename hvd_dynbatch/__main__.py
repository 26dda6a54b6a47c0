"""`python -m hvd_dynbatch` runs the CLI."""
from .cli import main

main()
