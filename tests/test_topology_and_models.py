"""Topologies (presets, files, errors that name the field) and the delay models."""

import subprocess
import sys

import pytest
from conftest import ROOT
from neuronabox.delay_models import available, load
from neuronabox.delay_models.collective import CollectiveFormulas
from neuronabox.delay_models.packet import Flow
from neuronabox.topology import PRESETS, HostWork, LinkClass, Topology, TopologyError
from neuronabox.topology import load as load_topology
from neuronabox.topology.presets import from_dict, parse_bandwidth, parse_latency

from neuronabox.schedules import GLOO_COLLECTIVES
from neuronabox.schedules.gloo import (
    BinomialBroadcast,
    DisseminationBarrier,
    RingAllgather,
    RingAllreduce,
    RingGeometry,
)
from neuronabox.schedules.gloo_pairwise import PairwiseAlltoall, RootedPairwise
from neuronabox.schedules.gloo_reduce import RingReduce, reduce_geometry


def schedule(kind: str, nbytes: int, world: int):
    """The Gloo schedule the caller hands a model (models sit below the schedules)."""
    if kind == "allreduce":
        return RingAllreduce.of(RingGeometry.for_tensor(world, nbytes, 1))
    if kind == "allgather":
        return RingAllgather(world, nbytes // world)
    if kind == "broadcast":
        return BinomialBroadcast(world, 0, nbytes)
    if kind == "reduce":
        return RingReduce(reduce_geometry(world, nbytes, 1), root=0)
    if kind in ("gather", "scatter"):
        return RootedPairwise(kind, world, 0, nbytes // world)
    if kind == "alltoall":
        return PairwiseAlltoall(world, nbytes // world)
    return DisseminationBarrier(world)


def cost(model, kind, nbytes, world):
    return model.collective_time(kind, nbytes, world, schedule(kind, nbytes, world))


def test_units():
    assert parse_bandwidth("100Gb/s", "x") == 100e9 / 8
    assert parse_bandwidth("25Gbps", "x") == 25e9 / 8
    assert parse_bandwidth("900GB/s", "x") == 900e9
    assert parse_latency("1.5us", "x") == pytest.approx(1.5e-6)
    assert parse_latency("2ms", "x") == pytest.approx(2e-3)
    assert parse_latency("0", "x") == 0.0
    with pytest.raises(TopologyError, match="expected a latency"):
        parse_latency("5", "x")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_load(name):
    t = load_topology(name)
    assert t.world_size == t.nnodes * t.ranks_per_node
    assert t.inter.bandwidth < t.intra.bandwidth or name == "cpu-25gbe"


def test_paths_follow_nodes_and_switches():
    t = load_topology("nvlink-400g").with_nodes(64, 8)
    assert t.path(0, 0) == []
    assert t.path(0, 7) == [t.intra]  # same node
    assert t.path(0, 8) == [t.inter, t.inter]  # same leaf switch
    assert t.path(0, 8 * 32) == [t.inter] * 4  # across the spine


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"links": {"intra": {"bandwidth": "1GB/s", "latency": "1us"}}}, "links.inter"),
        (
            {
                "links": {
                    "intra": {"bandwidth": "fast", "latency": "1us"},
                    "inter": {"bandwidth": "1GB/s", "latency": "1us"},
                }
            },
            "links.intra.bandwidth",
        ),
        (
            {
                "links": {
                    "intra": {"bandwidth": "1GB/s", "latency": "soon"},
                    "inter": {"bandwidth": "1GB/s", "latency": "1us"},
                }
            },
            "links.intra.latency",
        ),
        (
            {
                "nodes": 0,
                "links": {
                    "intra": {"bandwidth": "1GB/s", "latency": "1us"},
                    "inter": {"bandwidth": "1GB/s", "latency": "1us"},
                },
            },
            "nodes",
        ),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_topologies_name_the_field(doc, field):
    with pytest.raises(TopologyError, match=rf"^{field}[:.]"):
        from_dict(doc)


def test_topology_file_and_cli(tmp_path):
    f = tmp_path / "lab.yaml"
    f.write_text(
        "name: lab\nnodes: 4\nranks_per_node: 2\nlinks:\n  intra: {bandwidth: 10GB/s, latency: 1us}\n"
        "  inter: {bandwidth: 10Gb/s, latency: 20us}\n"
    )
    t = load_topology(str(f))
    assert (t.name, t.world_size, t.inter.bandwidth) == ("lab", 8, 10e9 / 8)

    def show():
        cmd = [sys.executable, "-m", "neuronabox.cli", "topology", "show", str(f)]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)

    ok = show()
    assert ok.returncode == 0 and "4 x 2 ranks = 8 ranks" in ok.stdout
    f.write_text("links:\n  intra: {bandwidth: 10GB/s, latency: 1us}\n  inter: {bandwidth: 10, latency: 20us}\n")
    bad = show()
    assert bad.returncode == 2 and "links.inter.bandwidth" in bad.stderr and len(bad.stderr.splitlines()) == 1


LINKS = "links:\n  intra: {bandwidth: 10GB/s, latency: 1us}\n  inter: {bandwidth: 10Gb/s, latency: 20us}\n"


def test_local_work_in_a_topology_file(tmp_path):
    """`local_work` reads back from YAML, survives resizing, shows in `describe`; presets have none."""
    f = tmp_path / "lab.yaml"
    f.write_text(LINKS + "local_work: {message: 8us, reduce: 3.2GB/s}\n")
    t = load_topology(str(f))
    assert (t.work.message, t.work.reduce_bandwidth) == (pytest.approx(8e-6), 3.2e9)
    assert t.work.reduce_per_byte == pytest.approx(1 / 3.2e9)
    assert t.with_nodes(64, 2).work == t.work
    assert "  local work       8 us per message, reduce 3.2 GB/s" in t.describe().splitlines()
    f.write_text(LINKS + "local_work: {message: 5us}\n")
    only = load_topology(str(f)).work
    assert (only.message, only.reduce_per_byte) == (pytest.approx(5e-6), 0.0)
    f.write_text(LINKS + "local_work: {reduce: 800MB/s}\n")
    assert load_topology(str(f)).work == HostWork(0.0, 800e6)
    f.write_text(LINKS)
    assert load_topology(str(f)).work == HostWork() and "local work" not in load_topology(str(f)).describe()
    for name in PRESETS:
        assert load_topology(name).work == HostWork() and not load_topology(name).work.any()


@pytest.mark.parametrize(
    "local_work,field",
    [
        ("{message: fast}", "local_work.message"),
        ("{message: 8}", "local_work.message"),
        ("{reduce: 3.2}", "local_work.reduce"),
        ("{reduce: 0GB/s}", "local_work.reduce"),
        ("{message: 8us, copy: 1GB/s}", "local_work.copy"),
        ("8us", "local_work"),
    ],
)
def test_invalid_local_work_names_the_field(tmp_path, local_work, field):
    f = tmp_path / "lab.yaml"
    f.write_text(LINKS + f"local_work: {local_work}\n")
    with pytest.raises(TopologyError, match=rf"{field}[:.]"):
        load_topology(str(f))


@pytest.mark.parametrize("model", ["alpha-beta", "collective", "packet", "zero"])
def test_models_expose_the_topologys_local_work(model):
    """Release times charge the model's `local_work`: the topology's, none under `zero`."""
    work = HostWork(8e-6, 3.2e9)
    base = load_topology("ib-100g")
    t = Topology(base.name, 4, 1, base.intra, base.inter, work=work)
    assert load(model, t).local_work == (HostWork() if model == "zero" else work)


def test_models_are_found_through_entry_points():
    assert {"zero", "alpha-beta", "collective", "packet"} <= set(available())
    with pytest.raises(ValueError, match="unknown delay model"):
        load("nope", load_topology("ib-100g"))


def slower(t: Topology, latency: float = 1.0, bandwidth: float = 1.0) -> Topology:
    def scale(lc):
        return LinkClass(lc.name, lc.bandwidth * bandwidth, lc.latency * latency)

    return Topology(
        t.name, t.nnodes, t.ranks_per_node, scale(t.intra), scale(t.inter), t.nodes_per_switch, t.switch_tiers
    )


@pytest.mark.parametrize("model", ["alpha-beta", "collective"])
@pytest.mark.parametrize("kind", GLOO_COLLECTIVES)
def test_models_are_monotone(model, kind):
    """More latency, less bandwidth, a larger world: never faster."""
    base = load_topology("ib-100g").with_nodes(1024, 1)
    for nbytes in (4 << 10, 1 << 20, 64 << 20):
        t0 = cost(load(model, base), kind, nbytes, 64)
        assert cost(load(model, slower(base, latency=2)), kind, nbytes, 64) > t0
        assert cost(load(model, slower(base, bandwidth=0.5)), kind, nbytes, 64) >= t0
        times = [cost(load(model, base), kind, nbytes, w) for w in (2, 16, 128, 1024)]
        assert times == sorted(times)


def test_classic_formulas_on_known_numbers():
    t = Topology("t", 4, 1, LinkClass("intra", 1e10, 1e-6), LinkClass("inter", 1e9, 5e-6), 8, 2)
    m = CollectiveFormulas(t)
    a, b = 10e-6, 1e9  # two inter hops up and down the leaf; bottleneck 1 GB/s
    assert m.collective_time("allreduce", 1 << 20, 4) == pytest.approx(6 * a + 1.5 * (1 << 20) / b)
    assert m.collective_time("broadcast", 1000, 4) == pytest.approx(2 * (a + 1000 / b))
    assert m.collective_time("barrier", 0, 4) == pytest.approx(2 * a)
    assert CollectiveFormulas(t, "recursive-doubling").collective_time("allreduce", 1000, 4) == pytest.approx(
        2 * (a + 1000 / b)
    )


def test_alpha_beta_walks_gloos_schedule():
    """Gloo's ring has 2W segments and keeps two steps in flight: 4(W-1) steps, one pace
    (a hop's latency plus both in-flight segments on the link) per two steps, which is
    the classic ring formula with the hop's alpha and beta."""
    t = load_topology("ib-100g").with_nodes(8, 1)
    m = load("alpha-beta", t)
    n = 8 << 20
    alpha, beta = 2 * t.inter.latency, t.inter.bandwidth
    assert cost(m, "allreduce", n, 8) == pytest.approx(2 * 7 * (alpha + 2 * (n // 16) / beta))
    assert cost(m, "allreduce", n, 8) == pytest.approx(2 * 7 * alpha + 2 * 7 / 8 * n / beta)
    with pytest.raises(ValueError, match="needs the allreduce schedule"):
        m.collective_time("allreduce", n, 8)


@pytest.mark.parametrize("kind", GLOO_COLLECTIVES)
def test_collective_formulas_spread_over_the_schedule(kind):
    """Walking the schedule with the collective model's hop gives the formula's time."""
    t = load_topology("cpu-25gbe").with_nodes(256, 1)
    m = load("collective", t)
    for w in (2, 7, 64, 256):
        for nbytes in (4 << 10, 3 << 20, 64 << 20):
            sched = schedule(kind, nbytes, w)
            want = m.collective_time(kind, nbytes, w, sched)
            assert sched.free_time(m.hop(kind, nbytes, w, sched)) == pytest.approx(want)


def test_packet_model_shares_links():
    """Two flows on one link take longer than one; flows on separate links do not."""
    t = load_topology("nvlink-400g").with_nodes(4)
    net = load("packet", t)
    one = net.transfer([Flow(0.0, 0, 8, 64 << 20)])[0]
    same_nic = net.transfer([Flow(0.0, 0, 8, 64 << 20), Flow(0.0, 1, 9, 64 << 20)])
    other_nics = net.transfer([Flow(0.0, 0, 8, 64 << 20), Flow(0.0, 16, 24, 64 << 20)])
    assert min(same_nic) > 1.9 * (one - net.message_time(0, 8, 0))
    assert max(other_nics) == pytest.approx(one)
    assert net.message_time(0, 8, 64 << 20) == pytest.approx(one)
    # In a collective: eight ranks of a node leave it together in a tree's far rounds,
    # so the packet model's broadcast is slower than the uncongested alpha-beta one.
    sched = schedule("broadcast", 16 << 20, 32)
    congested = net.collective_time("broadcast", 16 << 20, 32, sched)
    assert congested > load("alpha-beta", t).collective_time("broadcast", 16 << 20, 32, sched)
