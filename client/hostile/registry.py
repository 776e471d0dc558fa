"""The junk classes by name: each registers itself with ``@junk`` when its module is imported
(``client.hostile.cases`` imports them all, in the registry's order)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from client.hostile.context import Ctx, Target
from client.hostile.outcome import Outcome

JunkFn = Callable[[Ctx, Target], Awaitable[Outcome]]


@dataclass(frozen=True)
class JunkClass:
    name: str
    group: str  # http (bodies and values), conn (the HTTP transport), peer (the peer protocol)
    fn: JunkFn
    doc: str
    closes: bool = False  # the node may legitimately just close instead of answering
    needs_secret: bool = False
    needs_token: bool = False
    reasons: tuple[str, ...] = ()  # idc_peer_auth_rejected_total reasons it must raise
    refused: tuple[str, ...] = ()  # idc_http_refused_total reasons it must raise


REGISTRY: dict[str, JunkClass] = {}


def junk(name: str, group: str, *, closes: bool = False, needs_secret: bool = False,
         needs_token: bool = False, reasons: tuple[str, ...] = (),
         refused: tuple[str, ...] = ()) -> Callable[[JunkFn], JunkFn]:
    def register(fn: JunkFn) -> JunkFn:
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        REGISTRY[name] = JunkClass(name, group, fn, doc, closes, needs_secret, needs_token,
                                   reasons, refused)
        return fn
    return register
