"""A one-screen demonstration of the Forgetful Bloom Filter catching retries and forgetting.

``python -m cluster.fbf_demo``: a simulated client sends increments, a third of whose acks are
lost, and retries each of those with the same op id a little later. A counter guarded by an FBF
stays exact; an unguarded one over-counts. Then time moves on and the old ids are forgotten.
"""

from __future__ import annotations

import random

from cluster.core.fbf import ForgetfulBloomFilter


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def main() -> int:
    rng = random.Random(7)
    clock = _Clock()
    fbf = ForgetfulBloomFilter.for_window(window=10.0, rate=1000.0, fpp=1e-6, clock=clock)
    guarded = unguarded = expected = retries = caught = 0
    pending: list[tuple[float, bytes]] = []
    for seq in range(20_000):
        clock.t = seq / 1000.0  # 1000 ops/s for 20 s
        op = f"client-1:{seq}".encode()
        expected += 1
        for when, retry in list(pending):
            if when <= clock.t:
                pending.remove((when, retry))
                retries += 1
                unguarded += 1
                if fbf.add(retry):
                    guarded += 1
                else:
                    caught += 1
        unguarded += 1
        if fbf.add(op):
            guarded += 1
        if rng.random() < 1 / 3:  # the ack is lost: the client retries within 3 s
            pending.append((clock.t + rng.uniform(0.05, 3.0), op))
    print("Forgetful Bloom Filter demo: 20,000 increments at 1,000/s, a third of acks lost")
    print(f"  filter: m={fbf.m} bits x {fbf.n_past + 2} filters, k={fbf.k}, "
          f"period {fbf.period:.2f} s, window {fbf.window:.0f} s, {fbf.nbytes():,} bytes")
    print(f"  retries sent           {retries:>8,}")
    print(f"  retries caught by FBF  {caught:>8,}")
    print(f"  expected count         {expected:>8,}")
    print(f"  counter with FBF       {guarded:>8,}  (error {guarded - expected:+d})")
    print(f"  counter without dedup  {unguarded:>8,}  (error {unguarded - expected:+d})")
    print(f"  estimated FPP now      {fbf.estimated_fpp():.2e}")
    old = b"client-1:0"
    print(f"  op {old.decode()!r} remembered at t={clock.t:.0f} s? {old in fbf}")
    recent = f"client-1:{seq}".encode()
    clock.t += fbf.window * 0.99
    print(f"  op {recent.decode()!r} remembered {fbf.window * 0.99:.1f} s later? {recent in fbf}")
    clock.t += fbf.period * 2
    print(f"  ... and {fbf.window * 0.99 + 2 * fbf.period:.1f} s later? {recent in fbf}")
    # the only error allowed is a false positive (an under-count), rare at this FPP
    return 0 if expected - 1 <= guarded <= expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
