"""Layer 1, the bottom: pure structures and shared data, no I/O, no event loop.

The ring, the counter shards (PN-counter of G-counters, with hidden unpublished deltas), the
hashes, the Bloom filters, the Forgetful Bloom Filter and its Algorithm 3 policy, the dedup
strategies, the node's configuration, its metrics counters and its error tree. Time and hashes
are passed in; everything here is tested with plain synchronous tests and a fake clock. Imports
nothing above it (``pyproject.toml``'s import-linter contract).
"""
