"""A deterministic simulator: the real node code (``cluster.roles.member.Node`` and every role)
on a simulated clock, network and disk, driven by seeded clients and a seeded nemesis, judged by
``client.checker``. Run it as ``python -m cluster.sim`` (docs/sim.md).

    loop.py     ``SimLoop``: an asyncio loop whose time jumps to the next timer when idle
    disk.py     ``SimDisk`` (what survives a crash) and ``SimLog`` (the ``DurableLog`` API)
    net.py      ``SimNet`` and ``SimLink`` (the ``PeerLink`` call API), faults per frame
    world.py    ``World``: hosts, start / crash / restart / pause, the node's loops
    clients.py  clients with op ids and retries, the history in the checker's format
    run.py      one seed end to end: workload, nemesis, heal, quiet, final reads, check
"""
