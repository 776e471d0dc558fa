"""Layer 5: the edge, where the outside world comes in on the node's one port.

The listener tells peer connections from HTTP ones and keeps hostile clients in check; the raw
protocol (``raw``) serves the hot routes and hands other requests to the aiohttp app
(``http_api``); both answer through ``routes``, which validates every input (``validate``, the
contract's rules from ``idc_contract``) and calls the node (``cluster.roles.member``); the
OpenAPI description states this node's real limits. Above it there is only the wiring:
``cluster.server``, ``cluster.cli``, ``cluster.local``.
"""
