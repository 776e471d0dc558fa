"""Client side: SDK, fault-injecting proxy and chaos tools."""
