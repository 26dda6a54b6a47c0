"""Gradient weighting: the allreduce of unequal batches that equals one large-batch step.

Rank i computes g_i, the mean gradient over its b_i samples. The update must use

    g = sum_i b_i * g_i / B,      B = sum_i b_i,

the mean over the union of all ranks' samples. Horovod's `op=Average` divides by the number
of ranks instead, and Horovod rejects pre/post-scale factors that differ between ranks, so
each rank scales its own gradient by b_i / B before a `op=Sum` allreduce.

`DistributedOptimizer` wraps `hvd.DistributedOptimizer` that way: each gradient is multiplied
in place by the current weight where Horovod starts its allreduce, once the backward pass has
accumulated it (with `backward_passes_per_step` > 1, the sum of the passes takes the weight in
force then). A tensor hook per parameter, multiplying before accumulation into a new tensor,
cost 4 us more a gradient on a CPU core (0.8% of the CNN's forward and backward) and 3 ms a
step on ResNet-18's 62. The weight comes from a `DynamicBatching`
(`batching=`), which the optimizer also tells when compute ends (`synchronize`, once the
parameters' GPU has finished the step's kernels: see `device.wait_for_compute`), when the
allreduce has returned (the end of `synchronize`: the update starts) and when the step ends
(`step`); without one, tell it each step's batch sizes with
`set_batch_size(local, global)`; until then the weight is 1 / size, Horovod's plain average.

Both optimizers screen the reduced gradients before applying them: a step whose gradients
are not all finite (a NaN or infinite loss) changes neither the weights nor the optimizer's
state, and `finite` says so afterwards. The reduced gradients are the same on every rank, so
every rank decides alike, without a word exchanged.

With a loss scaler (`scaler=`, a `torch.amp.GradScaler`, for float16 autocast) the loss is
scaled before backward (`scaler.scale(loss).backward()`) and `step()` does the scaler's part
after the allreduce, as Horovod's recipe for gradient clipping places it: it unscales the
summed gradients, screens them, and updates the scale. A step whose gradients overflowed is
skipped on every rank alike and the scale backs off; `overflowed` says so. Call
`optimizer.step()`, not `scaler.step(optimizer)`. A scale that has backed off to 1 or below
means the gradients are not finite even unscaled: such a step is an ordinary non-finite one.

Horovod's wait for an allreduce loops with a thread yield and never sleeps, so a rank that
finishes its compute first holds a core while it waits. Where ranks share cores on purpose
(emulated heterogeneity on one machine) that slows the ranks still computing, so there the
optimizer can wait by napping instead (`nap=`, see `wait_napping`).
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

import torch

from ..errors import DynBatchError
from .device import parameters_device, wait_for_compute


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every element of `tensors` is finite (a sparse tensor: its values).

    One fused check per device and dtype, the one torch's `GradScaler` makes (it multiplies
    by 1 in place, which changes no value). On a CPU core a check per tensor took 130 us a
    step for the CNN's 8 gradients and 46 ms for ResNet-18's 62, 9% of its step; this one
    takes 7-13 us and 2 ms.
    """
    groups = {}
    for tensor in tensors:
        tensor = tensor.coalesce().values() if tensor.is_sparse else tensor
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    for (device, _), group in groups.items():
        found = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found,
                                                         torch.ones(1, device=device))
        if found.item():
            return False
    return True


def drop_nonfinite_gradients(optimizer) -> bool:
    """Whether every gradient `optimizer` would apply is finite; if not, all are dropped
    (set to None), so that its next step changes nothing (torch's optimizers skip parameters
    without a gradient, momentum included)."""
    params = [p for group in optimizer.param_groups for p in group["params"]
              if p.grad is not None]
    if all_finite(p.grad for p in params):
        return True
    for p in params:
        p.grad = None
    return False


def wait_napping(handles: Iterable, poll: Callable[[object], bool], nap: float,
                 polls: int = 50) -> None:
    """Return once `poll(h)` is true for every handle, napping `nap` seconds between polls
    after the first `polls`; Horovod's synchronize then returns at once.

    A wait ends at most `nap` later than a spinning one, a cost that only short steps feel:
    napping 0.2 ms on every wait put 20 ms steps 7-39% under plain Horovod in `overhead.py`,
    while in a 2-rank job on 2 cores a rank emulating a 4x slower worker measured 3.6-4.9x
    the other's compute, against 5.1-7.0x with Horovod's wait.
    """
    for handle in handles:
        for _ in range(polls):
            if poll(handle):
                break
        else:
            while not poll(handle):
                time.sleep(nap)


def batch_weight(local_batch: int, global_batch: int) -> float:
    """b_i / B: this rank's share of the step's samples, the factor on its mean gradient."""
    if global_batch < 1 or not 0 <= local_batch <= global_batch:
        raise DynBatchError(f"a local batch of {local_batch} does not fit a global batch of "
                            f"{global_batch}")
    return local_batch / global_batch


def screened_step(optimizer, step: Callable, closure=None):
    """Call `step(closure)` on gradients that are unscaled (with a loss scaler) and screened
    (see the module docstring); set `optimizer.finite` and `optimizer.overflowed`."""
    scaler = optimizer._scaler
    if scaler is not None:
        scaler.unscale_(optimizer)
    optimizer.finite = drop_nonfinite_gradients(optimizer)
    optimizer.overflowed = (scaler is not None and not optimizer.finite
                            and scaler.get_scale() > 1)
    if scaler is not None:
        scaler.update()
    return step(closure)


def _attach(optimizer, batching, scaler) -> None:
    """Give a wrapped optimizer its batching and loss scaler, and the screen's flags."""
    optimizer._batching, optimizer._scaler = batching, scaler
    optimizer.finite, optimizer.overflowed = True, False


class _BatchWeighted:
    """Mixed into Horovod's optimizer class: the weight, where it is applied, and the calls
    that tell a `DynamicBatching` where the step is. `_horovod` is Horovod's class."""

    def set_batch_size(self, local_batch: int, global_batch: int) -> None:
        """Weight this rank's gradients of the coming step by local / global."""
        if self._batching is not None:
            raise DynBatchError("this optimizer takes its weights from its DynamicBatching; "
                                "do not call set_batch_size")
        self._batch_weight = batch_weight(local_batch, global_batch)

    @property
    def batch_weight(self) -> float:
        return self._batch_weight if self._batching is None else self._batching.weight

    def synchronize(self):
        if self._batching is not None:
            wait_for_compute(parameters_device(self))
            self._batching.compute_done()
        if self._nap is not None:
            # Horovod keeps the gradients' allreduces in _handles, {param: (handle, ctx)}; a
            # handle is None or a callable for a gradient whose allreduce is not under way.
            wait_napping([h for h, _ in self._handles.values() if isinstance(h, int)],
                         self._poll, self._nap)
        result = self._horovod.synchronize(self)
        if self._batching is not None:
            self._batching.gradients_reduced()
        return result

    def step(self, closure=None):
        """Horovod's step (which waits for the allreduce) with the reduced gradients screened
        (see the module docstring), then, with a `DynamicBatching`, its `step_done()`: a
        collective at the steps an exchange is due."""
        # Horovod's step synchronizes unless inside skip_synchronize() or already done; the
        # screen goes between the two, so synchronize here as Horovod's step would.
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        with self.skip_synchronize():
            loss = screened_step(self, lambda c: self._horovod.step(self, c), closure)
        if self._batching is not None:
            self._batching.step_done()
        return loss

    # Horovod starts a gradient's allreduce in these two (from its hook, and from synchronize
    # for a gradient no hook saw, which it zeroes when there is none).
    def _allreduce_grad_async(self, p):
        if p.grad is not None:
            p.grad.mul_(self.batch_weight)
        return self._horovod._allreduce_grad_async(self, p)

    def _grouped_allreduce_grad_async(self, ps):
        torch._foreach_mul_([p.grad for p in ps], self.batch_weight)
        return self._horovod._grouped_allreduce_grad_async(self, ps)


def DistributedOptimizer(optimizer, named_parameters=None, batching=None,
                         nap: Optional[float] = None, scaler=None, **kwargs):
    """`hvd.DistributedOptimizer` whose allreduce is weighted by each rank's batch size.

    Takes Horovod's arguments except `op`, which is always `hvd.Sum`, and
    `gradient_predivide_factor`, which only applies to averaging. With `batching` (a
    `DynamicBatching`) the weights and the step's timing come from it; without, call
    `set_batch_size(local_batch, global_batch)` before each backward pass. The result is
    still an instance of the user's optimizer class (so schedulers and `state_dict` work).
    With `nap` (seconds) a rank waits for the allreduce by napping (see `wait_napping`):
    for ranks that share cores on purpose, never for speed. With `scaler` (a
    `torch.amp.GradScaler`) `step()` unscales, screens and updates the scale after the
    allreduce (see the module docstring). Horovod's `compression=hvd.Compression.fp16`
    sends the weighted gradients as float16.
    """
    import horovod.torch as hvd

    for name, fix in (("op", "it always reduces with op=hvd.Sum"),
                      ("gradient_predivide_factor", "the batch weights replace averaging")):
        if name in kwargs:
            raise DynBatchError(f"the weighted optimizer takes no '{name}' ({fix}); drop it")
    wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                       op=hvd.Sum, **kwargs)
    # Horovod builds its optimizer class on the fly from the user's class and calls
    # super(self.__class__, self), so a subclass of it would recurse. Instead the instance
    # moves to a sibling class: the same base and Horovod's methods, plus the weighting ones.
    # (Reassigning __class__ is how torch.nn.utils.parametrize extends modules, too.)
    horovod_class = type(wrapped)
    methods = {k: v for k, v in vars(_BatchWeighted).items() if not k.startswith("__")}
    wrapped.__class__ = type(horovod_class.__name__, horovod_class.__bases__,
                             {**vars(horovod_class), **methods, "_horovod": horovod_class})
    _attach(wrapped, batching, scaler)
    wrapped._nap, wrapped._poll = nap, hvd.poll
    wrapped._batch_weight = 1.0 / hvd.size()
    return wrapped


class _LocalSteps:
    """Mixed into the user's optimizer class in a job of one process: no allreduce (one rank's
    mean gradient is the step's), only the calls that tell the `DynamicBatching` where the
    step is. `_base` is the user's class."""

    def synchronize(self) -> None:
        wait_for_compute(parameters_device(self))
        self._batching.compute_done()
        self._batching.gradients_reduced()

    def step(self, closure=None):
        self.synchronize()
        loss = screened_step(self, lambda c: self._base.step(self, c), closure)
        self._batching.step_done()
        return loss


def LocalOptimizer(optimizer, batching, scaler=None):
    """`optimizer` as a one-process job's `DistributedOptimizer(..., batching=batching,
    scaler=scaler)`."""
    base = type(optimizer)
    methods = {k: v for k, v in vars(_LocalSteps).items() if not k.startswith("__")}
    optimizer.__class__ = type(base.__name__, (base,), {**methods, "_base": base})
    _attach(optimizer, batching, scaler)
    return optimizer
