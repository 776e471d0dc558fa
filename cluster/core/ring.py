"""The consistent-hash ring (``idc_contract.ring``): the SDK computes leaders with the same code."""

from idc_contract.ring import RING_HASH, RING_SEED, Ring, token

__all__ = ["RING_HASH", "RING_SEED", "Ring", "token"]
