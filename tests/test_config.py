"""The run's configuration: one set of defaults shared by the library and the command, the run
length, and settings checked with messages that name the option."""
import click
import pytest

from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.tools.cli import train
from hvd_dynbatch.training.config import TrainConfig


def parsed(*args) -> TrainConfig:
    """The configuration the train command builds from `args`, without running it."""
    with train.make_context("train", list(args)) as ctx:
        return TrainConfig(**ctx.params)


def test_the_command_and_the_library_share_their_defaults():
    assert parsed() == TrainConfig()
    assert parsed("--lr", "0.2", "--controller-gain", "0.3", "--window-gain", "0.7") == \
        TrainConfig(lr=0.2, controller_gain=0.3, window_gain=0.7)


@pytest.mark.parametrize("options, steps", [
    ({}, 23),                                # one epoch
    ({"epochs": 3}, 69),
    ({"max_steps": 50}, 50),                 # not capped by the default of one epoch
    ({"max_steps": 50, "epochs": 2}, 46),    # whichever comes first
    ({"max_steps": 10, "epochs": 2}, 10),
])
def test_run_length(options, steps):
    assert TrainConfig(**options).planned_steps(steps_per_epoch=23) == steps


def test_gains_reach_the_controller_and_the_window_rule():
    config = TrainConfig(controller_gain=0.25, integral_gain=0.0, window_gain=0.8)
    controller = config.controller_config()
    assert (controller.gain, controller.integral_gain) == (0.25, 0.0)
    assert config.window_rule().gain == 0.8


@pytest.mark.parametrize("options, text", [
    ({"controller_gain": 0}, "--controller-gain must be in (0, 1], got 0"),
    ({"controller_gain": 1.5}, "--controller-gain must be in (0, 1], got 1.5"),
    ({"integral_gain": -0.1}, "--integral-gain must not be negative, got -0.1"),
    ({"window_gain": 2.0}, "--window-gain) must be in (0, 1], got 2.0"),
    ({"epochs": 0}, "--epochs must be positive, got 0"),
    ({"max_steps": 0}, "--max-steps must be positive, got 0"),
    ({"hold_seconds": -1.0}, "--hold-seconds must be a number of seconds >= 0, got -1.0"),
    ({"hold_seconds": float("nan")}, "--hold-seconds must be a number of seconds >= 0"),
])
def test_bad_settings_name_the_option(options, text):
    with pytest.raises(DynBatchError) as error:
        TrainConfig(**options)
    assert text in str(error.value)


def test_an_unknown_option_is_refused_by_the_command():
    with pytest.raises(click.NoSuchOption):
        parsed("--gain", "0.5")
