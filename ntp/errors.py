"""The errors ntp raises, by who must act.

- The user's input is wrong (:class:`ConfigError`, :class:`MemoryPlanError`, ``storage.StoreError``): found before
  any rank trains, never retried (a retry would fail the same way); the message says what to change.
- A run went wrong (:class:`TrainingError` inside a rank, :class:`WorkerFailed` seen by the launcher): a retry may
  succeed (a lost node, a preempted GPU), so schedulers may retry these.
"""

from __future__ import annotations


class NtpError(Exception):
    """Base of every error ntp raises on purpose."""


class ConfigError(NtpError, ValueError):
    """A configuration value, or a combination of values, is invalid; the message says how to fix it."""


class MemoryPlanError(ConfigError):
    """The memory budget cannot hold the work it must: no chunk plan fits. The message says what would."""


class ModelFileError(ConfigError):
    """A model file is missing, unreadable, or does not fit the store it is applied to."""


class CheckpointError(ConfigError):
    """No checkpoint can be resumed: each is damaged, or was written by another configuration or store."""


class TrackingUnavailable(ConfigError):
    """The MLflow tracking server does not answer before the job starts; the message names it and the ways out."""


class TrainingError(NtpError, RuntimeError):
    """Training cannot go on inside a rank (non-finite loss, injected failure); the message says why."""


class WorkerFailed(NtpError, RuntimeError):
    """The training job failed or timed out; the message holds the failing rank's traceback."""


class Terminated(BaseException):
    """This process was told to stop (SIGTERM). Like KeyboardInterrupt it is no error of the program: runs it
    interrupts end KILLED, not FAILED."""


def is_input_error(exc: BaseException) -> bool:
    """True for errors of the user's input (configuration, memory plan, store): retrying cannot help."""
    from storage import StoreError  # storage is below ntp: the store's own error type

    return isinstance(exc, (ConfigError, StoreError))
