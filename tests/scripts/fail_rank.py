"""Rank 1 exits with an error while the other ranks wait for it in an allreduce."""
import sys

import horovod.torch as hvd
import torch

hvd.init()
if hvd.rank() == 1:
    print("rank 1 fails on purpose", flush=True)
    sys.exit(3)
hvd.allreduce(torch.ones(1), name="never_completes")
