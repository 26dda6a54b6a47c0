"""Tools over the library: the `hvd-dynbatch` CLI, the demo, plots, the local launcher and
job runner, the installation check, the simulator's scale study and Markdown tables."""
