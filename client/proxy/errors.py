"""The proxy's own error: a definition or operation the proxy refuses."""

from __future__ import annotations


class ProxyError(ValueError):
    """A proxy definition or operation is invalid (HTTP 400/404/409 in the control API)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
