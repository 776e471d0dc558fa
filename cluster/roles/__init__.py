"""Layer 4: the node's roles, the logic of one cluster member.

``member.Node`` wires them around one state, one log and its peer links: the coordinator
(routes ops to their leader), the leader (admit, dedup, apply, log, replicate, publish), the
replica (merge, fence, repair, read), admission (every rule that decides whether an op applies
now), checks (retries checked on the replicas) and the claims they take, settle (in-doubt ops
published or withdrawn), anti-entropy and hints, reads with repair, and failure detection. Each
role takes the collaborators it needs (a Protocol of its node where it needs several), never
``member``.
"""
