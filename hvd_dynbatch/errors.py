"""The package's exception types.

`DynBatchError` is raised for a mistake the user can fix (bad configuration, a missing data
directory, a launch that does not match the arguments); its message names the bad value and
what to do. The CLI turns it into a one-line error and a non-zero exit instead of a traceback.
"""


class DynBatchError(ValueError):
    """A user-facing error: bad input or a set-up that cannot work, with a message that says why."""


class LaunchError(DynBatchError):
    """The job was started in a way that does not fit what it was asked to do."""
