"""Where a rank computes: its device, the batches moved there, in what precision, and when its
compute has ended.

`resolve_device("auto", local_rank)` gives each rank of a node its own GPU, `cuda:local_rank`,
where CUDA is there, and the CPU elsewhere; "cpu", "cuda" (the same as auto, but an error
without a GPU) and "cuda:N" are explicit. Every rank given "cuda:N" shares that GPU; their
reductions then go through host memory (see `backends`). A batch goes to the device with
`to_device`, without blocking when it comes from pinned memory (a DataLoader with
`pin_memory=True`), so the copy overlaps the work already queued.

`autocast(device, "bf16")` runs the forward pass in bfloat16 where torch's autocast deems it
safe (matrix products and convolutions; losses and reductions stay in float32), on the GPU
and on the CPU alike. bfloat16 has float32's exponent range, so gradients neither overflow nor
underflow and no loss scaling is needed; the weights, the gradients Horovod sums and the
optimizer's state stay float32. "fp16" runs it in float16, whose range is narrow: small
gradients underflow to zero unless the loss is scaled up before backward, and the scale must
be lowered when a gradient overflows. `loss_scaler` gives the `torch.amp.GradScaler` for it;
the weighted optimizer (`weighting`) unscales and screens the gradients after Horovod has
summed them, so every rank takes the same skip-or-step decision. "off" is plain float32.

`channels_last` stores images as NHWC, which the tensor cores of recent GPUs convolve
fastest: `to_device(..., channels_last=True)` lays out each batch of images so, and the
convolutions' outputs follow the input's layout. The weights stay NCHW: Horovod broadcasts and
reduces contiguous tensors only ("Tensor is required to be contiguous", horovod#3491), and a
gradient takes its parameter's layout, so NCHW weights keep every gradient Horovod can sum.

CUDA kernels run asynchronously: after `loss.backward()` returns, the CPU has only queued
them, and a clock read then measures how fast it queued, not how long the GPU computed. The
controller would balance launch overhead. `wait_for_compute(device)` records an event on the
device's current stream and waits for it, so a clock read after it covers the GPU's work of
the step. It waits for that stream only: Horovod's allreduces run on their own streams, and
`torch.cuda.synchronize` would also wait for them, counting communication as compute. It is
placed where the CPU would wait anyway: in the optimizer's `synchronize`, just before it waits
for the allreduces. On the CPU every operation has finished when it returns; nothing waits.
"""
from __future__ import annotations

import contextlib

import torch

from ..errors import DynBatchError

PRECISIONS = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_device_spec(spec: str) -> None:
    """Raise `DynBatchError` unless `spec` is auto, cpu, cuda or cuda:N (N a GPU's index)."""
    if spec in ("auto", "cpu", "cuda"):
        return
    if spec.startswith("cuda:") and spec[5:].isdigit():
        return
    raise DynBatchError(f"unknown device '{spec}': choose auto, cpu, cuda or cuda:N")


def resolve_device(spec: str, local_rank: int) -> torch.device:
    """The device a rank with `local_rank` (its index among the ranks of its node) trains on.

    Raises `DynBatchError` for a GPU that is not there, naming how many there are.
    """
    check_device_spec(spec)
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DynBatchError(f"--device {spec}: this machine has no GPU that torch can use "
                            f"(torch {torch.__version__}, CUDA "
                            f"{torch.version.cuda or 'not built in'}); use --device cpu")
    count = torch.cuda.device_count()
    index = local_rank if spec in ("auto", "cuda") else int(spec[5:])
    if index >= count:
        raise DynBatchError(
            f"--device {spec}: this rank needs GPU {index} but the node has {count}; start "
            f"at most {count} ranks per node, one per GPU, or name one GPU (--device cuda:0) "
            f"for the ranks to share")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def check_amp(amp: str) -> None:
    """Raise `DynBatchError` unless `amp` is one of `PRECISIONS`."""
    if amp not in PRECISIONS:
        *others, last = PRECISIONS
        raise DynBatchError(f"unknown --amp '{amp}': choose {', '.join(others)} or {last}")


def autocast(device: torch.device, amp: str):
    """The context a forward pass runs in at precision `amp` on `device`."""
    check_amp(amp)
    if PRECISIONS[amp] is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=PRECISIONS[amp])


def loss_scaler(device: torch.device, amp: str):
    """The loss scaler precision `amp` needs on `device`: a `torch.amp.GradScaler` for
    "fp16", None otherwise."""
    check_amp(amp)
    return torch.amp.GradScaler(device.type) if amp == "fp16" else None


def to_device(tensors, device: torch.device, channels_last: bool = False) -> tuple:
    """`tensors` on `device`; a copy from pinned memory does not block. With
    `channels_last`, batches of images (4-D) are laid out NHWC."""
    moved = (t.to(device, non_blocking=t.is_pinned()) for t in tensors)
    if not channels_last:
        return tuple(moved)
    return tuple(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                 for t in moved)


def parameters_device(module_or_optimizer) -> torch.device:
    """The device of the first parameter of a module or an optimizer (the CPU if none)."""
    if isinstance(module_or_optimizer, torch.nn.Module):
        params = module_or_optimizer.parameters()
    else:
        params = (p for group in module_or_optimizer.param_groups for p in group["params"])
    first = next(iter(params), None)
    return torch.device("cpu") if first is None else first.device


def wait_for_compute(device: torch.device) -> None:
    """Return when `device` has finished the work queued on its current stream (at once on
    the CPU, whose operations are synchronous)."""
    if device.type == "cuda":
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()
