"""The Forgetful Bloom Filter (Subramanyam et al.) and its adaptive policy (Algorithm 3).

    filter.py   ForgetfulBloomFilter: the structure (Algorithms 1-2, refresh, estimates, merge,
                bytes) and its public reshaping (grow, fold, set_period)
    policy.py   AdaptivePolicy: when and how to reshape a filter (window-keeping Algorithm 3)
    codec.py    the v1 snapshot format (the filter's fields and its policy's state)
    layout.py   the bit-sliced words and the bulk operations on them
    hotpath.py  check+insert and check, one id or a batch: the numpy path, and the choice of it
                or the compiled kernel (_kernel.pyx, optional, the same bits)
"""

from cluster.core.fbf.filter import ForgetfulBloomFilter
from cluster.core.fbf.layout import MAX_FILTERS
from cluster.core.fbf.policy import AdaptivePolicy, PolicyState

__all__ = ["MAX_FILTERS", "AdaptivePolicy", "ForgetfulBloomFilter", "PolicyState"]
