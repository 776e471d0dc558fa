"""The well-behaved client: an SDK ``CounterClient`` adding small deltas to a few keys while
the junk runs, recording every op it knows was applied, was not, or may have been."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from client.errors import (
    ClientError,
    NotAppliedError,
    OutcomeUnknownError,
    RejectedError,
)
from client.sdk import CounterClient


@dataclass
class GoodStats:
    acked: Counter[str] = field(default_factory=Counter)  # key -> sum of acknowledged deltas
    acked_ops: int = 0
    unknown: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    not_applied: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def good_client(urls: Sequence[str], token: str | None, table: str, keys: Sequence[str],
                      stop: asyncio.Event, stats: GoodStats, *, rate: float, workers: int,
                      client_id: str, rng: random.Random, max_connections: int) -> None:
    """Add 1..3 to random ``keys`` at about ``rate`` ops/s until ``stop``; every outcome
    recorded (the SDK retries each op with its op id until acked or its deadline)."""
    async with CounterClient(list(urls), client_id=client_id, token=token, discover=False,
                             max_connections=max_connections) as client:
        interval = workers / rate if rate > 0 else 0.0

        async def worker() -> None:
            while not stop.is_set():
                key, delta = rng.choice(keys), rng.randint(1, 3)
                try:
                    await client.add(table, key, delta)
                    stats.acked[key] += delta
                    stats.acked_ops += 1
                except (RejectedError, NotAppliedError) as exc:
                    stats.not_applied += 1  # certainly not applied
                    stats.errors[type(exc).__name__] += 1
                except (OutcomeUnknownError, ClientError) as exc:
                    stats.unknown[key].append(delta)
                    stats.errors[type(exc).__name__] += 1
                if interval:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), interval * (0.5 + rng.random()))

        await asyncio.gather(*(worker() for _ in range(workers)))
