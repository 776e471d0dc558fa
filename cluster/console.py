"""``idemcount``: the project's one command; each subcommand runs a ``python -m`` entry point.

    idemcount up --nodes 3                  is   python -m cluster up --nodes 3
    idemcount node --id n1 ...              is   python -m cluster.node --id n1 ...
    idemcount chaos --duration 20           is   python -m client.chaos --duration 20

The table below names each subcommand's module the way ``python -m`` does, and the module is
imported only when its subcommand runs (``runpy``): the command stands above the server and the
client tools without either package importing the other. Every subcommand takes ``--help``
(what it does, then the module's own options) and ``--version``.
"""

from __future__ import annotations

import runpy
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

PROG = "idemcount"


@dataclass(frozen=True, kw_only=True)
class Command:
    module: str  # run as ``python -m module`` would run it
    lead: tuple[str, ...] = ()  # arguments put before the user's (a subcommand of the module)
    summary: str  # one line, for ``idemcount --help``
    about: str  # a paragraph, printed before the module's own --help
    options: bool = True  # False: the entry point reads no arguments (no --help of its own)


COMMANDS: dict[str, Command] = {
    "up": Command(
        module="cluster", lead=("up",),
        summary="run a local cluster of real node processes until Ctrl-C",
        about="Starts --nodes node processes on 127.0.0.1 (ports from --base-port, 7101 by "
              "default), prints each node's address and log, and stops them all on Ctrl-C. "
              "Peers sign their traffic with a fresh secret in DATA_DIR/cluster.secret. "
              "--nodes: how many processes (default 3); --rf: replicas per key (default 3). "
              "Flags after -- go to every node (see `idemcount node --help`)."),
    "node": Command(
        module="cluster.node",
        summary="run one node (a member of a cluster given by --peers, or --join)",
        about="Runs one member. It recovers its --data-dir (snapshot and log), prints "
              "`READY <id> <host:port>` on stdout once it serves, logs JSON lines on stderr, "
              "and on SIGTERM drains in-flight requests, flushes and exits 0. Every flag is "
              "also a field of --config FILE (JSON or TOML); docs/node.md has the details."),
    "decommission": Command(
        module="cluster", lead=("decommission",),
        summary="move every key range away from a member, which then exits",
        about="Asks the cluster (through --via, any live member) to drain member ID while "
              "clients keep writing; returns 0 once every member lists ID as left "
              "(docs/membership.md)."),
    "finalize": Command(
        module="cluster", lead=("finalize",),
        summary="after a rolling upgrade, let every member send and write the new protocol",
        about="Shows the release and protocol versions each member runs (--dry-run stops "
              "there), then has the cluster finalize the highest protocol every member speaks; "
              "refused while a member is down or runs an older release. Before it, any node "
              "can be rolled back to the release it came from (docs/operations.md)."),
    "chaos": Command(
        module="client.chaos",
        summary="a workload under fault injection, checked like Jepsen's counter checker",
        about="Starts a local cluster (or uses --nodes), puts a fault proxy in front of every "
              "node and peer link, runs a bounded workload while nemeses play (lost acks, "
              "duplicates, partitions, pauses, kill -9, clock skew, membership changes), then "
              "reads every replica and checks the history. Exit 0: valid; 1: a violation."),
    "hostile": Command(
        module="client.hostile",
        summary="throw malformed and hostile input at a cluster while a good client counts",
        about="Sends junk HTTP, connection abuse and forged peer frames to a running cluster "
              "while a well-behaved SDK client counts; checks that the good counts are exact, "
              "nothing junk was applied and every refusal had the documented shape "
              "(docs/security.md)."),
    "proxy": Command(
        module="client.proxy",
        summary="run the fault-injecting TCP proxy with its Toxiproxy-shaped control API",
        about="A proxy in front of nodes or peer links; its control API adds latency, drops, "
              "resets, lost acks, duplicates and reordering per proxy."),
    "sim": Command(
        module="cluster.sim",
        summary="the deterministic simulator: real node code on a virtual clock, net and disk",
        about="Runs one seed (--seed) or a sweep (--seeds A..B) of the node code under a seeded "
              "nemesis and checks every history; a failing seed replays byte for byte "
              "(docs/sim.md). Exit 1 on a violation."),
    "demo": Command(
        module="cluster.demo",
        summary="three real nodes; every op sent twice to two nodes; expected vs actual",
        about="Starts three node processes on free ports, sends every op twice to two "
              "different nodes, reads every counter from every node and prints expected "
              "against actual. Exit 1 on a mismatch. Takes no options.", options=False),
    "fbf-demo": Command(
        module="cluster.fbf_demo",
        summary="one screen: the Forgetful Bloom Filter catching retries, then forgetting",
        about="A simulated client whose acks are lost a third of the time retries with the "
              "same op id; a counter guarded by the filter stays exact, an unguarded one "
              "over-counts. Takes no options.", options=False),
}


def version() -> str:
    try:
        return metadata.version("idemcount")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} [--version] [--help] COMMAND [ARGS...]", "",
             "Idempotent distributed counters: the cluster, its tools and its checks.", "",
             "commands:"]
    for name, cmd in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {cmd.summary}")
    lines += ["", f"`{PROG} COMMAND --help` explains a command and lists its options. Each "
              "command is also", "`python -m MODULE` with the same arguments:"]
    lines += [f"  {PROG} {name:<{width}}  python -m {' '.join((cmd.module, *cmd.lead))}"
              for name, cmd in COMMANDS.items()]
    return "\n".join(lines)


def _before_separator(args: Sequence[str]) -> list[str]:
    """The arguments the subcommand itself reads (after ``--`` they belong to the nodes)."""
    out: list[str] = []
    for a in args:
        if a == "--":
            break
        out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"{PROG} {version()}")
        return 0
    name, rest = args[0], args[1:]
    cmd = COMMANDS.get(name)
    if cmd is None:
        print(f"{PROG}: unknown command {name!r}; one of {', '.join(COMMANDS)}\n"
              f"(`{PROG} --help` lists them)", file=sys.stderr)
        return 2
    own = _before_separator(rest)
    if "--version" in own:
        print(f"{PROG} {version()}")
        return 0
    if "-h" in own or "--help" in own:
        same = f"The same as `python -m {' '.join((cmd.module, *cmd.lead))}`"
        print(textwrap.fill(f"{PROG} {name}: {cmd.about}", 100) + "\n\n"
              + (f"{same}; its options:\n" if cmd.options else f"{same}."), flush=True)
        if not cmd.options:
            return 0
        rest = ["--help"]
    sys.argv = [f"{PROG} {name}", *cmd.lead, *rest]
    try:
        runpy.run_module(cmd.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # every entry point ends with sys.exit(main())
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
