"""HCCL collectives on multi-card topologies: what the cost model promises its users, the
topology presets' data, and the errors bad input gets."""

import math

import pytest
import tomllib

from pypto_lab.hw import get_chip
from pypto_lab.hw.collectives import (
    KINDS,
    TOPOLOGY_DIR,
    CollectiveCost,
    TopologyError,
    collective,
    get_topology,
    list_topologies,
    load_topology,
)

A2 = "Atlas800T-A2"
A2X2 = "Atlas800T-A2-x2"
MIB = 2**20


def test_shipped_topologies():
    assert list_topologies() == ["Atlas800I-A2", "Atlas800T-910A", "Atlas800T-A2", "Atlas800T-A2-x2"]
    a2 = get_topology(A2)
    assert (a2.chip, a2.cards_per_server, a2.servers) == ("Ascend910B3", 8, 1)
    hccs, roce = a2.intra_server, a2.inter_server
    assert (hccs.link, hccs.kind, hccs.links_per_card) == ("HCCS", "full_mesh", 7)
    # 28 GB/s per link and direction: the 56 GB/s per link / 392 GB/s per card quoted counts both directions
    assert hccs.link_gbps * 2 == 56 and hccs.card_gbps * 2 == 392
    assert (roce.link, roce.link_gbps * 8) == ("RoCE", 200)  # one 200GE port per NPU
    assert get_topology(A2X2).servers == 2 and get_topology(A2X2).max_cards == 16
    a = get_topology("Atlas800T-910A")
    assert a.chip == "Ascend910A" and [lv.size for lv in a.levels] == [4, 2, 1]
    assert [lv.link for lv in a.levels] == ["HCCS", "PCIe", "RoCE"]
    assert get_topology("Atlas800I-A2").chip == "Ascend910B4"
    for name in list_topologies():
        get_chip(get_topology(name).chip)  # every topology names a chip preset that loads


@pytest.mark.parametrize("name", ["Atlas800I-A2", "Atlas800T-910A", "Atlas800T-A2", "Atlas800T-A2-x2"])
def test_every_number_of_a_topology_has_a_source(name):
    doc = tomllib.loads((TOPOLOGY_DIR / f"{name}.toml").read_text())
    tables = [("topology", doc["topology"])] + [(f"levels[{i}]", lv) for i, lv in enumerate(doc["levels"])]
    for where, table in tables:
        for key, value in table.items():
            if key in ("name", "link", "kind") and isinstance(value, str):
                continue  # identifiers
            assert isinstance(value, dict) and value.get("source", "").strip(), f"{name}: {where}.{key}"
    assert len(get_topology(name).sources) == sum(1 for _, tb in tables for v in tb.values() if isinstance(v, dict))


@pytest.mark.parametrize("kind", KINDS)
def test_one_card_costs_nothing(kind):
    c = collective(kind, 64 * MIB, 1, A2)
    assert (c.time_us, c.steps, c.bytes_on_wire_per_card) == (0.0, 0, 0.0)
    assert c.to_dict()["time_us"] == 0.0


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_allreduce_moves_2_p_minus_1_over_p_of_the_tensor_per_card(p):
    n = 48 * MIB
    c = collective("allreduce", n, p, A2, algorithm="ring")
    assert c.steps == 2 * (p - 1)
    assert c.bytes_on_wire_per_card == pytest.approx(2 * (p - 1) / p * n)
    # every algorithm moves the same bytes; they differ in steps and in how many links carry them
    for algo in ("halving_doubling", "mesh"):
        assert collective("allreduce", n, p, A2, algorithm=algo).bytes_on_wire_per_card == pytest.approx(
            2 * (p - 1) / p * n)
    assert collective("allreduce", n, p, A2, algorithm="halving_doubling").steps == 2 * int(math.log2(p))
    assert collective("allreduce", n, p, A2, algorithm="mesh").steps == 2


def test_time_grows_with_bytes_and_approaches_the_bandwidth_term():
    topo = get_topology(A2)
    hccs, p = topo.intra_server, 8
    hbm = get_chip(topo.chip).hbm_gbps * 1e3  # bytes per us
    sizes = [2**k for k in range(10, 33, 2)]
    times = [collective("allreduce", n, p, A2, algorithm="ring").time_us for n in sizes]
    assert all(b > a for a, b in zip(times, times[1:]))

    def bandwidth_term(n):  # 2(p-1)/p n over one link, plus the reduction's HBM traffic
        return 2 * (p - 1) / p * n / (hccs.effective_gbps * 1e3) + (p - 1) / p * n * 3 / hbm

    ratios = [t / bandwidth_term(n) for n, t in zip(sizes, times)]
    assert ratios[0] > 10  # 1 KiB: latency-bound
    assert ratios[-1] == pytest.approx(1, rel=1e-3)  # 4 GiB: bandwidth-bound
    # what is left is the latency part: 2(p-1) steps of alpha plus the launch, the same for every size
    fixed = [t - bandwidth_term(n) for n, t in zip(sizes, times)]
    assert fixed == pytest.approx([topo.launch_us + 2 * (p - 1) * hccs.latency_us] * len(sizes))


def test_halving_doubling_beats_ring_on_small_messages_ring_or_mesh_win_or_tie_on_large():
    small, large = 4096, 1024 * MIB

    def t(n, algo):
        return collective("allreduce", n, 8, A2, algorithm=algo).time_us

    assert t(small, "halving_doubling") < t(small, "ring")
    assert t(large, "ring") <= t(large, "halving_doubling") * (1 + 1e-3)  # a tie: same bytes, alpha is noise
    assert t(large, "mesh") < t(large, "halving_doubling") / 5  # 7 links at once instead of one
    # with servers joined too, halving-doubling still takes fewer steps than the ring
    ring = collective("allreduce", small, 16, A2X2, algorithm="ring")
    rhd = collective("allreduce", small, 16, A2X2, algorithm="halving_doubling")
    assert rhd.steps < ring.steps and rhd.time_us < ring.time_us


def test_auto_picks_the_fastest_valid_algorithm():
    for n in (1024, MIB, 256 * MIB):
        auto = collective("allreduce", n, 8, A2)
        best = min(collective("allreduce", n, 8, A2, algorithm=a).time_us
                   for a in ("ring", "halving_doubling", "mesh"))
        assert auto.time_us == pytest.approx(best)
    assert collective("allreduce", MIB, 16, A2X2).algorithm.startswith("mesh+")  # mesh is not valid on RoCE
    assert collective("allreduce", MIB, 6, A2, algorithm="auto").time_us > 0  # 6 cards: no halving-doubling


def test_crossing_servers_costs_more_than_staying_within_one():
    for kind in KINDS:
        inside = collective(kind, 256 * MIB, 8, A2X2)
        across = collective(kind, 256 * MIB, 16, A2X2)
        assert inside.link == "HCCS" and across.link == "HCCS+RoCE"
        assert across.time_us > inside.time_us, kind
    # 8 cards as two half-servers would be slower still than one server's mesh: RoCE is 25 GB/s a card
    assert get_topology(A2X2).inter_server.card_gbps < get_topology(A2X2).intra_server.card_gbps


def test_hierarchical_allreduce_sends_only_a_1_over_8_share_between_servers():
    n = 64 * MIB
    c = collective("allreduce", n, 16, A2X2, algorithm="ring")
    roce = [ph for ph in c.phases if ph.link == "RoCE"]
    assert [ph.op for ph in c.phases] == ["reducescatter", "reducescatter", "allgather", "allgather"]
    assert sum(ph.bytes_on_wire_per_card for ph in roce) == pytest.approx(2 * (2 - 1) / 2 * n / 8)
    assert c.to_dict()["phases"][0]["level"] == "intra-server"


def test_910a_server_is_two_hccs_groups_joined_by_pcie():
    four = collective("allreduce", 64 * MIB, 4, "Atlas800T-910A")
    eight = collective("allreduce", 64 * MIB, 8, "Atlas800T-910A")
    assert four.link == "HCCS" and eight.link == "HCCS+PCIe"
    assert eight.time_us > four.time_us


def test_collective_cost_is_frozen_and_serialisable():
    c = collective("allgather", MIB, 8, A2)
    assert isinstance(c, CollectiveCost)
    with pytest.raises(AttributeError):
        c.time_us = 0  # type: ignore[misc]
    d = c.to_dict()
    assert {"kind", "algorithm", "cards", "nbytes", "time_us", "steps", "bytes_on_wire_per_card", "link"} <= set(d)
    assert d["algbw_gbps"] == pytest.approx(MIB / (c.time_us * 1e3))


@pytest.mark.parametrize("args, words", [
    (("allreduc", MIB, 8, A2), ["kind = 'allreduc'", "unknown collective", "did you mean 'allreduce'"]),
    (("allreduce", MIB, 8, A2, "tree"), ["algorithm = 'tree'", "unknown algorithm", "fix:"]),
    (("allreduce", MIB, 9, A2), ["cards = 9", "more cards than topology Atlas800T-A2 has", "Atlas800T-A2-x2"]),
    (("allreduce", MIB, 0, A2), ["cards = 0", "positive integer", "fix:"]),
    (("allreduce", MIB, 12, A2X2), ["cards = 12", "multiple of 8", "use 8 or 16 cards"]),
    (("allreduce", -1, 8, A2), ["nbytes = -1", ">= 0", "fix:"]),
    (("allreduce", MIB, 16, A2X2, "mesh"), ["'mesh'", "needs a full-mesh level", "inter-server", "fix:"]),
    (("allreduce", MIB, 8, "DGX-H100"), ["unknown topology 'DGX-H100'", "Atlas800T-A2"]),
])
def test_bad_input_names_the_rule_the_value_and_a_fix(args, words):
    with pytest.raises(TopologyError) as exc:
        collective(*args)
    for w in words:
        assert w in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_halving_doubling_on_six_cards_is_refused_clearly():
    with pytest.raises(TopologyError) as exc:
        collective("allreduce", MIB, 6, A2, algorithm="halving_doubling")
    msg = str(exc.value)
    assert "power-of-two" in msg and "has 6 cards" in msg and "use 4 or 8 cards" in msg and "'ring'" in msg
    assert collective("allreduce", MIB, 6, A2, algorithm="ring").steps == 10  # ring takes any count


def _write(tmp_path, edit):
    text = (TOPOLOGY_DIR / f"{A2}.toml").read_text()
    path = tmp_path / "custom.toml"
    path.write_text(edit(text))
    return path


def test_a_copied_topology_with_a_changed_value_loads(tmp_path):
    path = _write(tmp_path, lambda t: t.replace("value = 28.0", "value = 56.0", 1))
    faster = collective("allreduce", 256 * MIB, 8, path, algorithm="mesh")
    assert get_topology(path).intra_server.link_gbps == 56.0
    assert faster.time_us < collective("allreduce", 256 * MIB, 8, A2, algorithm="mesh").time_us


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace('kind = "full_mesh"', 'kind = "torus"'), ["levels[0].kind", "torus", "unknown link kind"]),
    (lambda t: t.replace("value = 7,", "value = 3,", 1), ["links_per_card", "needs 7 links per card", "fix:"]),
    (lambda t: t.replace("value = 28.0", "value = -28.0", 1), ["link_gbps", "-28.0", "must be > 0"]),
    (lambda t: t.replace('value = "Ascend910B3"', 'value = "Ascend999"'), ["topology.chip", "Ascend999", "Ascend910B1"]),
    (lambda t: t.replace("[topology]\n", "[topology]\nturbo = 1\n"), ["topology.turbo", "unknown key", "fix:"]),
])
def test_a_broken_topology_file_names_key_value_and_fix(tmp_path, edit, words):
    path = _write(tmp_path, edit)
    with pytest.raises(TopologyError) as exc:
        load_topology(path)
    msg = str(exc.value)
    assert str(path) in msg and "fix:" in msg
    for w in words:
        assert w in msg
