"""Reading a run's metrics records: where the controller's first split took effect, and the
throughput from a step on (what the demo prints beside the whole run's speedup)."""
import pytest

from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.tools.demo import _after_first_move
from hvd_dynbatch.training.metrics import first_move, throughput_from


def records(splits, seconds):
    """Step records of a run whose step k trained `splits[k]` and took `seconds[k]` of its
    clock, then its eval and summary records."""
    clock, out = 0.0, []
    for step, (split, took) in enumerate(zip(splits, seconds)):
        clock += took
        out.append({"step": step, "time": clock, "batch_sizes": list(split),
                    "global_batch": sum(split)})
    out.append({"type": "eval", "step": len(splits), "accuracy": 0.9})
    out.append({"type": "summary", "train_seconds": clock})
    return out


def test_the_first_move_is_the_first_step_at_batches_more_than_a_sample_apart():
    # An epoch's short last step at an even split (85, 84) is not a move.
    run = records([(128, 128)] * 3 + [(85, 84)] + [(200, 56)] * 2, [1.0] * 6)
    assert first_move(run) == 4
    assert first_move(records([(128, 128), (85, 84)], [1.0, 1.0])) is None


def test_throughput_from_a_step_counts_its_samples_over_the_clock_since_the_step_before():
    run = records([(128, 128)] * 2 + [(200, 56)] * 3, [2.0, 2.0, 1.0, 1.5, 0.5])
    assert throughput_from(run, 2) == pytest.approx(3 * 256 / 3.0)
    assert throughput_from(run, 0) == pytest.approx(5 * 256 / 7.0)
    with pytest.raises(DynBatchError, match="no steps from step 5"):
        throughput_from(run, 5)


def test_the_demo_reads_the_speedup_from_the_first_move_and_the_time_before_it():
    static = records([(128, 128)] * 6, [2.0] * 6)
    dynamic = records([(128, 128)] * 2 + [(200, 56)] * 4, [2.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    assert _after_first_move(static, dynamic) == (
        "from step 2 on, where the controller's first split took effect: 2.00x (samples/s: "
        "static 128, dynamic 256); the 2 steps before it, at equal batches while the "
        "controller timed the workers, took 50% of the dynamic run's time")
    assert _after_first_move(static, static) == "the controller kept equal batches throughout"
    assert "after the end of the static run" in _after_first_move(static[:2], dynamic)
