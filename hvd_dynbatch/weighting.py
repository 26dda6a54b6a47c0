"""Gradient weighting: the allreduce of unequal batches that equals one large-batch step.

Rank i computes g_i, the mean gradient over its b_i samples. The update must use

    g = sum_i b_i * g_i / B,      B = sum_i b_i,

the mean over the union of all ranks' samples. Horovod's `op=Average` divides by the number
of ranks instead, and Horovod rejects pre/post-scale factors that differ between ranks, so
each rank scales its own gradient by b_i / B before a `op=Sum` allreduce.

`DistributedOptimizer` wraps `hvd.DistributedOptimizer` that way: a hook on every parameter
multiplies the gradient by the current weight before it is accumulated into `.grad`, which is
before Horovod's own hook starts the allreduce. Tell it each step's batch sizes with
`set_batch_size(local, global)`; until then the weight is 1 / size, Horovod's plain average.
"""
from __future__ import annotations

from .errors import DynBatchError


def batch_weight(local_batch: int, global_batch: int) -> float:
    """b_i / B: this rank's share of the step's samples, the factor on its mean gradient."""
    if global_batch < 1 or not 0 <= local_batch <= global_batch:
        raise DynBatchError(f"a local batch of {local_batch} does not fit a global batch of "
                            f"{global_batch}")
    return local_batch / global_batch


class _BatchWeighted:
    """Mixed into Horovod's optimizer class: the weight and the hooks that apply it."""

    def set_batch_size(self, local_batch: int, global_batch: int) -> None:
        """Weight this rank's gradients of the coming backward pass by local / global."""
        self._batch_weight = batch_weight(local_batch, global_batch)

    @property
    def batch_weight(self) -> float:
        return self._batch_weight

    def _register_weight_hooks(self, weight: float) -> None:
        self._batch_weight = weight
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.register_hook(lambda grad: grad * self._batch_weight)


def DistributedOptimizer(optimizer, named_parameters=None, **kwargs):
    """`hvd.DistributedOptimizer` whose allreduce is weighted by each rank's batch size.

    Takes Horovod's arguments except `op`, which is always `hvd.Sum`. The result is still an
    instance of the user's optimizer class (so schedulers and `state_dict` work) with one more
    method, `set_batch_size(local_batch, global_batch)`, to call before each backward pass.
    """
    import horovod.torch as hvd

    if "op" in kwargs:
        raise DynBatchError("the weighted optimizer always reduces with op=hvd.Sum; drop 'op'")
    wrapped = hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                       op=hvd.Sum, **kwargs)
    # Horovod builds its optimizer class on the fly from the user's class and calls
    # super(self.__class__, self), so a subclass of it would recurse. Instead the instance
    # moves to a sibling class: the same base and Horovod's methods, plus the weighting ones.
    # (Reassigning __class__ is how torch.nn.utils.parametrize extends modules, too.)
    horovod_class = type(wrapped)
    methods = {k: v for k, v in vars(_BatchWeighted).items() if not k.startswith("__")}
    wrapped.__class__ = type(horovod_class.__name__, horovod_class.__bases__,
                             {**vars(horovod_class), **methods})
    wrapped._register_weight_hooks(1.0 / hvd.size())
    return wrapped
