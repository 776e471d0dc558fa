"""A fault-injecting TCP proxy modelled on Toxiproxy, with message-level toxics for HTTP and
for the cluster's peer frames (see ``client.proxy.toxics`` for every toxic).

    async with ProxyServer() as srv:
        p = await srv.create("n1", "127.0.0.1:0", "127.0.0.1:7101", protocol="http")
        p.add_toxic(type="lost_ack", toxicity=0.3)     # the node applies, the answer is lost
        ... talk to p.url ...
"""

from client.proxy.server import Proxy, ProxyError, ProxyServer
from client.proxy.toxics import MESSAGE_TOXICS, STREAM_TOXICS, Toxic, ToxicError

__all__ = ["MESSAGE_TOXICS", "STREAM_TOXICS", "Proxy", "ProxyError", "ProxyServer", "Toxic",
           "ToxicError"]
