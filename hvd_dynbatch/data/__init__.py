"""Data: the datasets by name (`datasets`) and the torch `Dataset` views the step loaders
read from (`loader`). Torch, no Horovod."""
