"""The node's error tree; each error knows its HTTP status, wire code and whether a retry helps.

    ClusterError                       retriable?  status  code
    +-- BadRequest                     no          400     bad_request / bad_op_id / bad_delta / ...
    |   +-- BodyTooLarge               no          413     body_too_large
    |   +-- RequestTimeout             no          408     request_timeout (slow client)
    +-- Unauthorized                   no          401     unauthorized (bearer token)
    +-- TooManyConnections             yes         429     too_many_connections
    +-- OpExpired                      no          410     op_expired
    +-- Unavailable                    yes         503     unavailable (quorum not met in time)
    +-- PeerError                      yes         503     peer_error (a peer link failed)
    +-- ConfigError (also ValueError)  no          -       bad configuration, names the field

Errors raised below the transport boundary (OSError, msgpack errors) are translated once, in
``cluster.transport.peer`` and ``cluster.edge.http_api``, with ``raise ... from exc``.
"""

from __future__ import annotations


class ClusterError(Exception):
    """Base of every error the node reports to a caller."""

    status = 500
    code = "internal"
    retriable = False

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class BadRequest(ClusterError):
    """Malformed input: the request was rejected whole, nothing was applied or logged."""

    status = 400
    code = "bad_request"


class BodyTooLarge(BadRequest):
    status = 413
    code = "body_too_large"


class RequestTimeout(BadRequest):
    """The request's headers or body did not arrive in time (a slow or stalled client)."""

    status = 408
    code = "request_timeout"


class Unauthorized(ClusterError):
    """A token is required and the request has none, or not a valid one."""

    status = 401
    code = "unauthorized"


class TooManyConnections(ClusterError):
    """The client address already holds as many connections as a client may."""

    status = 429
    code = "too_many_connections"
    retriable = True


class OpExpired(ClusterError):
    """The op is older than the window in which its retries can be recognised: outcome unknown."""

    status = 410
    code = "op_expired"


class Unavailable(ClusterError):
    """Too few replicas answered in time; the op may or may not be applied, a retry is safe."""

    status = 503
    code = "unavailable"
    retriable = True


class PeerError(Unavailable):
    """A peer connection failed or answered with something unexpected."""

    code = "peer_error"


class ConfigError(ClusterError, ValueError):
    """A configuration value is out of range; the message names the field."""

    code = "bad_config"


class Departed(ClusterError):
    """This node left the cluster (decommissioned, or replaced): it does not start again. Its
    process exits 0, so a supervisor that restarts failed processes leaves it stopped."""
