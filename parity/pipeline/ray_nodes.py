"""What each node of a Ray cluster can run, and the Ray options that place a cell on the nodes that can run it.

A node started with ``ray start --resources "$(parity worker-resources)"`` *declares* its stacks: a cell requests one
unit of each stack it needs (and ``parity-bench`` when it times) and Ray places it among the nodes that have them.
A node that declares none of parity's resources (``ray start --head`` with no options) is *probed*: one small task
pinned to it reports the stacks installed there (``parity.run.stacks.advertised``, what ``parity worker-resources``
would print on it), and a cell it can run is placed by Ray's node-id label on such nodes, requesting only CPUs and
GPUs. A probed node has no ``parity-bench`` unit, so a timing cell there takes all of its CPUs: it runs alone on it.
A cell goes to declared nodes where any can take it, else to probed ones; where none can, it is skipped with why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parity.platform.errors import one_line
from parity.run import stacks

PROBE_TIMEOUT_S = 60.0
NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node, its id
PARITY_RESOURCES = (*stacks.STACKS, stacks.BENCH)
HINT = (
    'a node runs what it declares with `ray start --resources "$(parity worker-resources)"`, else what is '
    "installed there"
)


@dataclass(frozen=True)
class Node:
    """One alive node: its id and host, its resources (Ray's totals, plus the stacks its probe found) and whether it
    declared parity's resources itself; ``problem``: why a probed node can run nothing (its probe failed)."""

    id: str
    hostname: str
    resources: dict[str, float] = field(default_factory=dict)
    declared: bool = False
    problem: str | None = None


def missing(request: dict, resources: dict) -> list[str]:
    """What of ``request`` (``num_cpus``, ``num_gpus``, ``resources``) ``resources`` does not have, as "name amount"."""
    wanted = {"CPU": request["num_cpus"], "GPU": request["num_gpus"], **request["resources"]}
    return [f"{name} {amount:g}" for name, amount in wanted.items() if amount and resources.get(name, 0.0) < amount]


def probe(ray, timeout_s: float = PROBE_TIMEOUT_S) -> list[Node]:
    """Every alive node of the cluster ``ray`` is connected to; each node that declares none of parity's resources
    is asked what it has installed, all at once (a node that does not answer within ``timeout_s`` runs nothing)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    nodes, asked = [], {}
    task = ray.remote(stacks.advertised)
    for info in alive:
        node = Node(
            info["NodeID"],
            info.get("NodeManagerHostname") or info["NodeID"][:8],
            dict(info["Resources"]),
            declared=any(name in info["Resources"] for name in PARITY_RESOURCES),
        )
        nodes.append(node)
        if not node.declared:
            ref = task.options(num_cpus=0, max_retries=0, label_selector={NODE_LABEL: node.id}).remote()
            asked[ref] = node
    ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout_s) if asked else ([], [])
    found = {}
    for ref in ready:
        node = asked[ref]
        try:
            installed = {name: amount for name, amount in ray.get(ref).items() if name in stacks.STACKS}
            found[node.id] = Node(node.id, node.hostname, {**node.resources, **installed})
        except Exception as error:  # noqa: BLE001 - parity missing there, a lost node: that node runs nothing
            found[node.id] = Node(
                node.id,
                node.hostname,
                node.resources,
                problem=f"its probe failed ({one_line(f'{type(error).__name__}: {error}', 200)})",
            )
    for ref in late:
        ray.cancel(ref, force=True)
        node = asked[ref]
        found[node.id] = Node(
            node.id, node.hostname, node.resources, problem=f"it did not answer the probe within {timeout_s:g} s"
        )
    return [found.get(node.id, node) for node in nodes]


def place(request: dict, nodes: list[Node], timing: bool) -> tuple[dict | None, str | None]:
    """The Ray task options of a cell that asks for ``request`` (``num_cpus``, ``num_gpus``, ``resources``: its
    stacks, ``parity-bench`` when ``timing``, an ``accelerator_type``), or None and why no node can run it."""
    if any(node.declared and not missing(request, node.resources) for node in nodes):
        return dict(request), None
    plain = {**request, "resources": {k: v for k, v in request["resources"].items() if k not in PARITY_RESOURCES}}
    needs = {**plain, "resources": {k: v for k, v in request["resources"].items() if k != stacks.BENCH}}
    able = [node for node in nodes if not node.declared and not node.problem and not missing(needs, node.resources)]
    if not able:
        return None, why_not(needs, nodes)
    if timing:  # no parity-bench unit on a probed node: the cell takes every CPU of nodes of one size, so runs alone
        sizes: dict[float, list[Node]] = {}
        for node in able:
            sizes.setdefault(node.resources.get("CPU", 0.0), []).append(node)
        cpus, able = max(sizes.items(), key=lambda item: (len(item[1]), item[0]))
        plain["num_cpus"] = cpus
    ids = [node.id for node in able]
    return {**plain, "label_selector": {NODE_LABEL: ids[0] if len(ids) == 1 else f"in({','.join(ids)})"}}, None


def why_not(request: dict, nodes: list[Node]) -> str:
    """Why no node of ``nodes`` can run a cell asking for ``request``: what none has, or what none has together
    (nodes without a CPU, which run no cell, and nodes whose probe failed are left out and the latter named)."""
    lacking = [missing(request, node.resources) for node in nodes if not node.problem and node.resources.get("CPU")]
    everywhere = [
        item for item in (lacking[0] if lacking else missing(request, {})) if all(item in items for items in lacking)
    ]
    together = list(dict.fromkeys(item for items in lacking for item in items))
    text = (
        f"no node of the cluster has {', '.join(everywhere)}"
        if everywhere
        else f"no node of the cluster has {' and '.join(together)} together"
    )
    broken = [f"{node.hostname}: {node.problem}" for node in nodes if node.problem]
    return text + (f"; not usable: {'; '.join(broken)}" if broken else "") + f" ({HINT})"
