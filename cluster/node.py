"""``python -m cluster.node``: run one node of the cluster (the flags are ``cluster.cli``'s).

The member itself, ``Node``, is ``cluster.roles.member``; this module is only the entry point.
"""

from __future__ import annotations

import sys

from cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
