"""Client side of the idempotent counters: the SDK, the fault-injecting proxy and the chaos tools.

The SDK's public surface is what this module exports; everything else is private to ``client``.
"""

from client.config import ClientConfig
from client.errors import (
    BadRequestError,
    ClientClosedError,
    ClientError,
    ConfigurationError,
    DeadlineExceededError,
    NotAppliedError,
    OpExpiredError,
    OutcomeUnknownError,
    RejectedError,
    TransientError,
)
from client.retry import AddResult
from client.sdk import CounterClient
from client.stats import ClientStats
from client.sync import SyncCounterClient

__all__ = [
    "AddResult",
    "BadRequestError",
    "ClientClosedError",
    "ClientConfig",
    "ClientError",
    "ClientStats",
    "ConfigurationError",
    "CounterClient",
    "DeadlineExceededError",
    "NotAppliedError",
    "OpExpiredError",
    "OutcomeUnknownError",
    "RejectedError",
    "SyncCounterClient",
    "TransientError",
]
