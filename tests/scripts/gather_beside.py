"""The toolkit's all-gather under a launcher, used as the timing exchange uses it: started,
then other work, then its result.

Each rank prints one JSON line: the rows of a gather started before a Horovod allreduce and
finished after it, and how long the last rank waited for a gather that rank 0 started and
then left alone for `HOLD` seconds before asking for its result.
"""
import json
import sys
import time

import horovod.torch as hvd
import torch

from hvd_dynbatch.backend.comm import for_horovod

HOLD = 2.0

hvd.init()
comm = for_horovod()
rank, last = hvd.rank(), hvd.size() - 1
result = comm.allgather_async([rank, 10.0 * rank])
total = hvd.allreduce(torch.full((1000,), float(rank)), op=hvd.Sum, name="beside").sum().item()
rows = result().tolist()

hvd.barrier()
result = comm.allgather_async([rank])
started = time.perf_counter()
if rank == 0:
    time.sleep(HOLD)
late = result()[:, 0].tolist()
waited = time.perf_counter() - started
# One rank at a time: lines printed at the same moment can merge in horovodrun's output.
# One write per line: with unbuffered output, print() writes the line's end on its own, and
# Open MPI's tagged output can then tag the two pieces apart ('{...}[1,0]<stdout>:').
for turn in range(hvd.size()):
    hvd.barrier()
    if turn == rank:
        sys.stdout.write(json.dumps({"rank": rank, "backend": comm.backend, "rows": rows,
                                     "allreduce_total": total, "late_rows": late,
                                     "waited": waited, "hold": HOLD}) + "\n")
        sys.stdout.flush()
hvd.barrier()
