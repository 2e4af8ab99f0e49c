"""capacity.shortfall: which groups the alive nodes can never hold, and what the message advises."""

from orchestrator.backends.capacity import bundles_per_node, shortfall


def node(i, cpus, alive=True, gpus=0):
    return {"NodeID": f"{i:056x}", "Alive": alive, "NodeManagerAddress": "10.0.0.1",
            "Resources": {"CPU": cpus, **({"GPU": gpus} if gpus else {})}}


def test_a_bundle_never_spans_nodes():
    assert bundles_per_node({"CPU": 1.5}, {"CPU": 2}) == 1
    assert bundles_per_node({"CPU": 1, "GPU": 1}, {"CPU": 8, "GPU": 2}) == 2
    assert bundles_per_node({"CPU": 1, "GPU": 1}, {"CPU": 8}) == 0


def test_strict_pack_needs_one_node_and_only_then_advises_pack():
    two = [node(1, 1), node(2, 1)]
    why = shortfall(2, {"CPU": 1}, "STRICT_PACK", two)
    assert why and "resources.placement=PACK" in why
    assert shortfall(2, {"CPU": 1}, "PACK", two) is None
    assert shortfall(2, {"CPU": 1}, "STRICT_PACK", [node(1, 2)]) is None


def test_a_lost_node_is_named_and_pack_is_not_advised():
    nodes = [node(1, 2), node(2, 2, alive=False)]
    why = shortfall(2, {"CPU": 1.5}, "SPREAD", nodes)
    assert why.startswith("the cluster cannot hold 2 ranks x {'CPU': 1.5} (SPREAD)")
    assert f"lost node(s): {2:056x}" in why and "PACK" not in why
    assert shortfall(2, {"CPU": 1}, "STRICT_SPREAD", nodes) is not None
    assert shortfall(1, {"CPU": 1}, "STRICT_SPREAD", nodes) is None
