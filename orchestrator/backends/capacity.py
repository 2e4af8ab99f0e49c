"""What the Ray cluster can hold now, from its alive nodes' total resources: asked before a worker group is
placed, so a group that can never be placed (a node was lost, the cluster is too small) is reported at once
instead of after a placement-group wait; and which of a group's nodes died, when one of its ranks is lost."""

from __future__ import annotations

import math
from typing import Any, Iterable

import ray

STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")


def _nodes() -> list[dict[str, Any]]:
    return ray.nodes()


def dead_nodes(node_ids: Iterable[str]) -> set[str]:
    """The ids among ``node_ids`` that Ray now reports as dead."""
    wanted = set(node_ids)
    return {n["NodeID"] for n in _nodes() if n["NodeID"] in wanted and not n["Alive"]}


def bundles_per_node(bundle: dict[str, float], resources: dict[str, float]) -> int:
    """How many ``bundle``s one node's total ``resources`` hold (a bundle never spans nodes)."""
    fits = [math.floor(resources.get(k, 0.0) / v + 1e-9) for k, v in bundle.items() if v]
    return max(0, min(fits)) if fits else 0


def shortfall(world_size: int, bundle: dict[str, float], strategy: str,
              nodes: list[dict[str, Any]] | None = None) -> str | None:
    """Why ``world_size`` bundles can never be placed with ``strategy`` on the alive nodes; None when they can.

    Totals, not what is free now: a group only waits for resources other groups hold, never for ones that
    are gone.
    """
    nodes = _nodes() if nodes is None else nodes
    alive = [n for n in nodes if n["Alive"]]
    per_node = [bundles_per_node(bundle, n.get("Resources", {})) for n in alive]
    if strategy == "STRICT_PACK":
        ok = max(per_node, default=0) >= world_size
    elif strategy == "STRICT_SPREAD":
        ok = sum(1 for k in per_node if k >= 1) >= world_size
    else:  # PACK, SPREAD: best effort over nodes, each bundle on one node
        ok = sum(per_node) >= world_size
    if ok:
        return None
    have = ", ".join(f"{n['NodeID'][:12]} ({n.get('NodeManagerAddress', '?')}): {k}" for n, k in zip(alive, per_node))
    dead = [n for n in nodes if not n["Alive"]]
    why = (f"the cluster cannot hold {world_size} ranks x {bundle} ({strategy}): ranks per alive node: "
           f"{have or 'no alive node'}")
    if dead:
        why += "; lost node(s): " + ", ".join(f"{n['NodeID']} ({n.get('NodeManagerAddress', '?')})" for n in dead)
    if strategy == "STRICT_PACK" and sum(per_node) >= world_size:
        return why + ". No one node holds the group: use resources.placement=PACK, or lower resources.world_size"
    return why + ". Lower resources.world_size or cpus_per_rank/gpus_per_rank, or add nodes to the cluster"
