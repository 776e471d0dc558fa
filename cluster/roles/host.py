"""What every role reads of the node it runs in: the shape each role's own ``Node`` protocol
extends with what that role needs besides (``reads``, ``checks``, ``settle``, ``antientropy``).
The node itself is ``member.Node``; the roles never import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cluster.core.config import NodeConfig
    from cluster.core.membership import Placement
    from cluster.core.metrics import NodeMetrics
    from cluster.roles.state import NodeState
    from cluster.transport.peer import PeerLink


class Host(Protocol):
    """The node's id, configuration, ring, state, peer links and metrics."""

    id: str
    config: NodeConfig
    ring: Placement
    state: NodeState
    links: dict[str, PeerLink]
    metrics: NodeMetrics
