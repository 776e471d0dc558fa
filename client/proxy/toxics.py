"""Toxic definitions: Toxiproxy's stream toxics plus message-level ones; validation only.

A toxic is ``{"name", "type", "stream", "toxicity", "attributes"}`` as in Toxiproxy's API.
``stream`` is ``upstream`` (client to server) or ``downstream`` (server to client).

Stream toxics act on bytes, in any protocol; their ``toxicity`` is drawn once per connection
(as Toxiproxy does; a connection open when the toxic is added draws on its next chunk):

    latency     latency, jitter (ms)          delay every chunk by latency +- jitter
    bandwidth   rate (KB/s)                   pace the bytes
    slow_close  delay (ms)                    delay the close after the source closed
    timeout     timeout (ms)                  drop all data; close after timeout (0: never)
    reset_peer  timeout (ms)                  TCP RST both sides after timeout
    slicer      average_size, size_variation (bytes), delay (us)   cut chunks into slices
    limit_data  bytes                         close once this many bytes went through

Message toxics act on whole messages: HTTP requests/responses for ``protocol="http"``,
length-prefixed peer frames (``cluster.transport.wire``) for ``protocol="peer"``. Their
``toxicity`` is drawn per message (so a retry on the same connection gets a fresh draw):

    drop        mode ("hang"|"close")   upstream: the request never reaches the server;
                                        downstream: the server processed the request and its
                                        answer is lost (the lost ack)
    lost_ack    mode                    ``drop`` on the downstream (its default stream)
    duplicate   delay (ms), copies      deliver the message again, at once or after delay
                                        (HTTP: on another upstream connection, answer discarded)
    delay       latency, jitter (ms)    hold the message; HTTP requests are held apart from
                                        their connection, so one still arrives after its client
                                        gave up (an original racing its retry)
    reorder     count, window (ms)      hold up to ``count`` messages or ``window`` ms, then
                                        release them in a shuffled order
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STREAM_TOXICS: dict[str, dict[str, Any]] = {
    "latency": {"latency": 0, "jitter": 0},
    "bandwidth": {"rate": 0},
    "slow_close": {"delay": 0},
    "timeout": {"timeout": 0},
    "reset_peer": {"timeout": 0},
    "slicer": {"average_size": 0, "size_variation": 0, "delay": 0},
    "limit_data": {"bytes": 0},
}
MESSAGE_TOXICS: dict[str, dict[str, Any]] = {
    "drop": {"mode": "hang"},
    "lost_ack": {"mode": "close"},
    "duplicate": {"delay": 0, "copies": 1},
    "delay": {"latency": 0, "jitter": 0},
    "reorder": {"count": 2, "window": 50},
}
DEFAULT_STREAM = {"lost_ack": "downstream", "drop": "upstream", "duplicate": "upstream",
                  "delay": "upstream", "reorder": "upstream"}
PROTOCOLS = ("tcp", "http", "peer")
STREAMS = ("upstream", "downstream")


class ToxicError(ValueError):
    """A toxic definition is invalid; the message names the field."""


@dataclass(slots=True)
class Toxic:
    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def is_message(self) -> bool:
        return self.type in MESSAGE_TOXICS

    def attr(self, name: str) -> Any:
        return self.attributes[name]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "stream": self.stream,
                "toxicity": self.toxicity, "attributes": dict(self.attributes)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], protocol: str = "tcp") -> Toxic:
        if not isinstance(data, Mapping):
            raise ToxicError("toxic: expected an object")
        kind = data.get("type")
        if kind not in STREAM_TOXICS and kind not in MESSAGE_TOXICS:
            raise ToxicError(f"type: unknown toxic {kind!r}; one of "
                             f"{sorted(STREAM_TOXICS) + sorted(MESSAGE_TOXICS)}")
        stream = data.get("stream") or DEFAULT_STREAM.get(kind, "downstream")
        if stream not in STREAMS:
            raise ToxicError(f"stream: must be upstream or downstream, got {stream!r}")
        toxicity = data.get("toxicity", 1.0)
        if isinstance(toxicity, bool) or not isinstance(toxicity, int | float) \
                or not 0.0 <= toxicity <= 1.0:
            raise ToxicError(f"toxicity: must be a number in [0, 1], got {toxicity!r}")
        defaults = STREAM_TOXICS.get(kind) or MESSAGE_TOXICS[kind]
        given = data.get("attributes") or {}
        if not isinstance(given, Mapping):
            raise ToxicError("attributes: expected an object")
        unknown = set(given) - set(defaults)
        if unknown:
            raise ToxicError(f"attributes.{sorted(unknown)[0]}: not an attribute of {kind}")
        attrs = {**defaults, **given}
        _check_attrs(kind, attrs)
        if kind in MESSAGE_TOXICS:
            _check_protocol(kind, stream, protocol)
        name = data.get("name") or f"{kind}_{stream}"
        if not isinstance(name, str):
            raise ToxicError("name: must be a string")
        return cls(name, kind, stream, float(toxicity), attrs)


def _check_attrs(kind: str, attrs: dict[str, Any]) -> None:
    for key, value in attrs.items():
        if key == "mode":
            if value not in ("hang", "close"):
                raise ToxicError(f"attributes.mode: hang or close, got {value!r}")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ToxicError(f"attributes.{key}: must be a number >= 0, got {value!r}")
    if kind == "reorder" and attrs["count"] < 2:
        raise ToxicError("attributes.count: reorder needs at least 2 messages")
    if kind == "duplicate" and attrs["copies"] < 1:
        raise ToxicError("attributes.copies: at least 1")


def _check_protocol(kind: str, stream: str, protocol: str) -> None:
    if protocol == "tcp":
        raise ToxicError(f"type: {kind} acts on messages; create the proxy with "
                         "protocol http or peer")
    if kind == "lost_ack" and stream != "downstream":
        raise ToxicError("stream: lost_ack drops answers, so it is downstream only")
    if protocol == "http" and stream == "downstream" and kind in ("duplicate", "reorder"):
        raise ToxicError(f"stream: {kind} of HTTP responses is not supported (one request is in "
                         "flight per connection); use it upstream")
