"""The Forgetful Bloom Filter's public import path (CONTRACT.md: ``from cluster.fbf import
ForgetfulBloomFilter``). The structure and its policy live in ``cluster.core.fbf``."""

from __future__ import annotations

from cluster.core.fbf import MAX_FILTERS, AdaptivePolicy, ForgetfulBloomFilter

__all__ = ["MAX_FILTERS", "AdaptivePolicy", "ForgetfulBloomFilter"]
