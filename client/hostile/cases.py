"""Every junk class, in ``REGISTRY`` in the order the runner runs them and ``--list`` shows them.

Importing a case module registers its classes, so the order of the imports below is the
registry's order; it also picks each class's target node in a round (class i of round r hits
node (r + i) mod n). Keep it.
"""

# isort: off
from client.hostile import cases_http  # noqa: F401  (registers its classes)
from client.hostile import cases_http_limits  # noqa: F401
from client.hostile import cases_http_routes  # noqa: F401
from client.hostile import cases_connection  # noqa: F401
from client.hostile import cases_peer  # noqa: F401
from client.hostile import cases_regressions  # noqa: F401
# isort: on
from client.hostile.registry import REGISTRY, JunkClass

__all__ = ["REGISTRY", "JunkClass"]
