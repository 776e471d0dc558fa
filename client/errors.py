"""The client SDK's error tree; every error says whether retrying can help and what is known
about the op's outcome.

    ClientError                          retriable  applied?   what it means
    +-- ConfigurationError (ValueError)  no         -          bad client settings; names the field
    +-- ClientClosedError                no         not sent   the client was closed
    +-- RejectedError                    no         no         the cluster refused the op whole
    |   +-- BadRequestError              no         no         400: malformed op, never applied
    +-- TransientError                   yes        maybe      one attempt failed; same op id again
    |   +-- UnavailableError             yes        maybe      503: quorum not met in time
    |   +-- ServerError                  yes        maybe      another 5xx, or an unreadable answer
    |   +-- AttemptTimeoutError          yes        maybe      no answer within attempt_timeout
    |   +-- ConnectionLostError          yes        maybe      connection broke after sending
    |   +-- ConnectFailedError           yes        no         could not connect: nothing sent
    +-- NotAppliedError                  yes        no         every attempt failed before sending
    +-- OutcomeUnknownError              no         unknown    the SDK stopped retrying; the op may
        |                                                      or may not be counted
        +-- DeadlineExceededError        no         unknown    total deadline (inside the window)
        +-- OpExpiredError               no         unknown    410: older than the cluster's window

``TransientError`` is what one attempt raises inside the retry loop. A write (an add or a
delete: both are ops with op ids) either succeeds (a duplicate answer is a success: the op was
applied earlier), or raises ``RejectedError`` / ``NotAppliedError`` (certainly not applied),
or ``OutcomeUnknownError`` (never a silent guess). Reads (``get``, ``get_many``, a ``scan``
page) and table settings change no count, so once ``total_timeout`` has passed they raise
their last ``TransientError`` as it is: a later call may succeed. Retrying an
``OutcomeUnknownError`` with the same op id is not offered: the cluster may no longer recognise
it, so a retry could count twice. Lower-layer errors (aiohttp, OSError, asyncio timeouts) are
translated once, in ``client.transport``, with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base of every error the SDK raises."""

    retriable = False
    #: True: certainly applied; False: certainly not; None: unknown
    applied: bool | None = None

    def __init__(self, message: str, *, op_id: str | None = None, node: str | None = None,
                 attempts: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.op_id = op_id
        self.node = node
        self.attempts = attempts

    def describe(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "op_id": self.op_id,
                "node": self.node, "attempts": self.attempts, "retriable": self.retriable,
                "applied": self.applied}


class ConfigurationError(ClientError, ValueError):
    """A client setting is out of range; the message names the field."""

    applied = False


class ClientClosedError(ClientError):
    applied = False


class RejectedError(ClientError):
    """The cluster refused the op before applying anything."""

    applied = False

    def __init__(self, message: str, *, status: int = 0, code: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status
        self.code = code


class BadRequestError(RejectedError):
    pass


class TransientError(ClientError):
    """One attempt failed in a way another attempt (same op id) may fix."""

    retriable = True


class UnavailableError(TransientError):
    pass


class ServerError(TransientError):
    pass


class AttemptTimeoutError(TransientError):
    pass


class ConnectionLostError(TransientError):
    pass


class ConnectFailedError(TransientError):
    """The connection could not be opened, so this attempt never reached a node."""

    applied = False


class NotAppliedError(ClientError):
    """Every attempt failed before its request left the client: certainly not applied, and a
    new call (later, or with other nodes) may succeed."""

    retriable = True
    applied = False


class OutcomeUnknownError(ClientError):
    """The SDK gave up on an op whose fate it cannot know: it may or may not be counted."""

    applied = None


class DeadlineExceededError(OutcomeUnknownError):
    pass


class OpExpiredError(OutcomeUnknownError):
    pass


__all__ = [
    "AttemptTimeoutError",
    "BadRequestError",
    "ClientClosedError",
    "ClientError",
    "ConfigurationError",
    "ConnectFailedError",
    "ConnectionLostError",
    "DeadlineExceededError",
    "NotAppliedError",
    "OpExpiredError",
    "OutcomeUnknownError",
    "RejectedError",
    "ServerError",
    "TransientError",
    "UnavailableError",
]
