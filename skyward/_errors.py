"""Skyward's exceptions: one tree, every class exported from ``skyward``.

::

    SkywardError
     ├─ ProvisionError      a provider could not create (or fully clean up) nodes
     │   ├─ HostKeyError     an SSH host's key is unknown or changed
     │   ├─ ProvisionCancelled  provisioning stopped: the pool was closed meanwhile
 │   └─ NoSpecStarted    every sky.Spec of a pool failed to start (each with its reason)
     ├─ BootstrapError      a node could not be prepared (missing packages, failed image script)
     ├─ ChannelError        the link to a worker failed
     │   ├─ VersionMismatch  the worker's Python differs from the client's
     │   ├─ WorkerLost       a worker died with calls in flight (node, exit status, stderr tail)
     │   ├─ CollectiveHang   ranks of a gang pool waited in a collective the others had left
     │   └─ StartError       a worker could not start (around_app raised, Ready never came)
     ├─ RemoteError         a remote exception that could not be sent back as itself
     ├─ SerializationError  a function, argument or result that cannot be pickled
     ├─ PluginError         a plugin is invalid, unpicklable, or out of order
     ├─ MissingDependency   an optional package (paramiko, boto3, jax) is not installed; names
     │                      the extra that installs it (also an ImportError)
     └─ PoolClosed          the pool is not running (never started, or already closed)

``Terminated`` is no ``SkywardError``: it is a ``KeyboardInterrupt`` that SIGTERM or SIGHUP
raise in the main thread while a pool is open (``pool/signals.py``), so that everything that
cleans up after Ctrl-C cleans up after them too.

Configuration mistakes are pydantic ``ValidationError``s (they name the field); a call that
exceeds its ``timeout=`` raises the builtin ``TimeoutError``. A remote exception that pickles
is re-raised as its own type with a ``RemoteTraceback`` as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class SkywardError(Exception):
    """Base class of every error Skyward raises itself."""


class ProvisionError(SkywardError):
    """A provider could not create nodes, or could not fully clean them up."""


class HostKeyError(ProvisionError):
    """An SSH host's key is unknown (and accepting new keys was not asked for) or changed."""


class ProvisionCancelled(ProvisionError):
    """Provisioning stopped because the pool was closed meanwhile: what a provider raises
    (through ``request.deadline.check``) when its deadline is cancelled."""


class NoSpecStarted(ProvisionError):
    """No ``sky.Spec`` of a pool could make its machines. The message lists every spec and
    why; ``attempts`` holds them (each with its ``spec`` and its ``error``), in the order
    tried. What each made was destroyed before the next was tried."""

    def __init__(self, message: str, *, attempts: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.attempts = list(attempts)

    def __reduce__(self) -> tuple[object, ...]:
        return (NoSpecStarted, (str(self),), self.__dict__)


class BootstrapError(SkywardError):
    """A node could not be prepared to run the worker.

    When the image's script failed: ``command`` is the command that failed, ``exit_status``
    its exit code, ``log_tail`` the last lines the script printed.
    """

    def __init__(
        self,
        message: str,
        *,
        command: str | None = None,
        exit_status: int | None = None,
        log_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.command = command
        self.exit_status = exit_status
        self.log_tail = log_tail
        # Pickles as it is: Exception's pickling rebuilds it from the message (every other
        # argument has a default) and restores these attributes from __dict__.


class ChannelError(SkywardError):
    """The link to a worker failed."""


class VersionMismatch(ChannelError):
    """The worker runs a different Python minor version than the client."""


class WorkerLost(ChannelError):
    """A worker process ended while calls were in flight on it.

    ``node`` is the rank, ``exit_status`` the process's exit code (negative: killed by that
    signal, ``None``: unknown), ``stderr_tail`` the last lines it wrote to stderr.
    """

    def __init__(
        self,
        message: str,
        *,
        node: int,
        exit_status: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.node = node
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields would be lost by Exception's default pickling.
        return (_rebuild_worker_lost, (str(self), self.node, self.exit_status, self.stderr_tail))


def _rebuild_worker_lost(
    message: str, node: int, exit_status: int | None, stderr_tail: str
) -> WorkerLost:
    return WorkerLost(message, node=node, exit_status=exit_status, stderr_tail=stderr_tail)


class CollectiveHang(ChannelError):
    """In a gang pool (jax), some ranks stayed blocked in a collective that the other ranks
    had left (they finished the call, or never entered it): it could never complete.

    ``finished`` are the ranks that had finished the call; ``blocked`` maps each blocked
    rank to where it waited (its stacks, from the user's code down to the call into jax).
    The pool restarts every rank, as it does for a lost one.
    """

    def __init__(
        self, message: str, *, finished: tuple[int, ...] = (), blocked: dict[int, str] | None = None
    ) -> None:
        super().__init__(message)
        self.finished = finished
        self.blocked = dict(blocked or {})

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_hang, (str(self), self.finished, self.blocked))


def _rebuild_hang(
    message: str, finished: tuple[int, ...], blocked: dict[int, str]
) -> CollectiveHang:
    return CollectiveHang(message, finished=finished, blocked=blocked)


class StartError(ChannelError):
    """A worker started but could not become ready (a plugin's ``around_app`` raised)."""


class RemoteError(SkywardError):
    """A remote exception that could not be sent back as itself.

    ``type_name`` is the remote exception's qualified type name; ``traceback`` the remote
    traceback as text.
    """

    def __init__(self, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.traceback = traceback

    def __reduce__(self) -> tuple[object, ...]:
        return (RemoteError, (self.type_name, str(self).partition(": ")[2], self.traceback))


class SerializationError(SkywardError):
    """A function, argument or return value cannot be pickled."""


class PluginError(SkywardError):
    """A plugin is invalid, cannot be pickled, or is in the wrong place in the list."""


class MissingDependency(SkywardError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


class PoolClosed(SkywardError):
    """The pool is not running: it was never started, or it has been closed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived while a pool was open (a job scheduler's cancel, a closed
    terminal, ``kill PID``). Raised in the main thread, like Ctrl-C's ``KeyboardInterrupt``,
    so that open pools close on the way out; if nothing catches it, the process then ends
    as killed by ``signal``."""

    def __init__(self, signal: int) -> None:
        import signal as signals

        super().__init__(f"{signals.Signals(signal).name}: the process was asked to stop")
        self.signal = signal

    def __reduce__(self) -> tuple[object, ...]:
        return (Terminated, (self.signal,))


class RemoteTraceback(Exception):
    """The ``__cause__`` of a re-raised remote exception: its traceback, as text."""

    def __init__(self, traceback: str) -> None:
        super().__init__(traceback)
        self.traceback = traceback

    def __str__(self) -> str:
        return f"\n\nRemote traceback:\n{self.traceback}"


def describe_status(status: int | None) -> str:
    """A worker's exit status in words, for ``WorkerLost`` (negative: killed by a signal)."""
    import signal

    if status is None:
        return "an unknown status (still running, or not reported)"
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"exit code {status}"
