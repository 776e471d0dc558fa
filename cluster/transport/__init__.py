"""Layer 3: peer-to-peer transport. Length-prefixed msgpack frames (``wire``), HMAC-signed
with per-connection keys (``auth``), over persistent links that batch every call of one loop turn
into one frame per peer (``peer``). Knows nothing of what the frames mean; the node's roles
(``cluster.roles``) send and answer them.
"""
