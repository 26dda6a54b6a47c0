"""hvd-dynbatch: data-parallel training with Horovod on workers that are not alike."""

__version__ = "0.1.0"
