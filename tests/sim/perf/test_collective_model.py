"""The alpha-beta collective baseline: hand-computed cases, NCCL-style selection at its boundaries,
the `[nvlink]` hardware table, and the fitted families' use of the baseline."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from sim.calibration.select import efficiency_model_for
from sim.dtypes import DType
from sim.errors import ConfigError
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.collective_model import (
    BASE_LATENCY_S,
    CUSTOM_AR_BARRIER_S,
    CUSTOM_AR_LAUNCH_S,
    HOP_LATENCY_S,
    LL,
    LL_MAX_BUS_BW,
    NVLS,
    NVLS_EFFICIENCY,
    P2P,
    RING,
    SIMPLE,
    custom_allreduce_time_s,
    nccl_time,
    node_floor_ratio,
    topology_log_factor,
)
from sim.perf.efficiency import KernelColumns
from sim.perf.kernel_features import feature_names
from sim.perf.roofline import roofline
from sim.specs.catalog import _data_dir, load_hardware
from sim.specs.hardware import HardwareSpec

MIB = 1024.0 * 1024.0


def _no_nvls(hw: HardwareSpec) -> HardwareSpec:
    assert hw.nvlink is not None
    return dataclasses.replace(hw, nvlink=dataclasses.replace(hw.nvlink, nvls=False))


def test_large_ring_all_reduce_is_latency_plus_wire_bytes_over_link_bandwidth() -> None:
    hw = _no_nvls(load_hardware("h100_sxm"))
    n, msg = 8, 256 * MIB
    ph = nccl_time("all_reduce", msg, n, hw)
    assert (int(ph.algo[0]), int(ph.proto[0])) == (RING, SIMPLE)
    lat = BASE_LATENCY_S[RING][SIMPLE] + 2 * (n - 1) * HOP_LATENCY_S["nvlink"][RING][SIMPLE]  # 8.4 + 14 x 3.4 us
    expected = lat + 2 * (n - 1) / n * msg / 450e9
    assert ph.latency_s[0] == pytest.approx(lat)
    assert ph.time_s[0] == pytest.approx(expected)


def test_small_all_reduce_takes_ll_and_its_latency_does_not_scale_with_the_link() -> None:
    h100, b200 = _no_nvls(load_hardware("h100_sxm")), _no_nvls(load_hardware("b200_sxm"))
    n, msg = 8, 4096.0
    a, b = nccl_time("all_reduce", msg, n, h100), nccl_time("all_reduce", msg, n, b200)
    assert int(a.proto[0]) == LL and int(b.proto[0]) == LL
    lat = BASE_LATENCY_S[RING][LL] + 14 * HOP_LATENCY_S["nvlink"][RING][LL]
    assert a.time_s[0] == pytest.approx(lat + 1.75 * msg / min(0.5 * 450e9, LL_MAX_BUS_BW[2]))
    # Twice the NVLink bandwidth: the same latency, so a small message is barely faster (not 2x).
    assert b.time_s[0] / a.time_s[0] > 0.95


def test_ll_to_simple_switch_happens_where_their_times_cross() -> None:
    hw = load_hardware("l40s")  # PCIe: no LL128, no NVLS; ring LL vs ring Simple
    bw = hw.intra_node_link.bandwidth_bytes_per_s
    n = 2
    lat_ll = BASE_LATENCY_S[RING][LL] + 2 * HOP_LATENCY_S["pcie"][RING][LL]
    lat_s = BASE_LATENCY_S[RING][SIMPLE] + 2 * HOP_LATENCY_S["pcie"][RING][SIMPLE]
    # lat_ll + w / (0.5 bw) = lat_s + w / bw  ->  w = (lat_s - lat_ll) x bw  (w = wire bytes = msg here)
    cross = (lat_s - lat_ll) * bw
    below = nccl_time("all_reduce", 0.9 * cross, n, hw)
    above = nccl_time("all_reduce", 1.1 * cross, n, hw)
    assert int(below.proto[0]) == LL
    assert int(above.proto[0]) == SIMPLE


def test_nvls_takes_large_all_reduce_where_the_switch_reduces() -> None:
    hw = load_hardware("h100_sxm")
    msg = 256 * MIB
    ph = nccl_time("all_reduce", msg, 8, hw)
    assert int(ph.algo[0]) == NVLS
    assert ph.time_s[0] == pytest.approx(HOP_LATENCY_S["nvlink"][NVLS][SIMPLE] + msg / (NVLS_EFFICIENCY[2] * 450e9))
    # A100's second-generation NVSwitch has no NVLS: ring.
    assert int(nccl_time("all_reduce", msg, 8, load_hardware("a100_sxm")).algo[0]) == RING
    # Two GPUs: a ring step beats one switch traversal.
    assert int(nccl_time("all_reduce", msg, 2, hw).algo[0]) == RING


def test_alltoall_is_point_to_point() -> None:
    hw = load_hardware("h100_sxm")
    msg, n = 64 * MIB, 8
    ph = nccl_time("alltoall", msg, n, hw)
    assert (int(ph.algo[0]), int(ph.proto[0])) == (P2P, SIMPLE)
    lat = BASE_LATENCY_S[P2P][SIMPLE] + HOP_LATENCY_S["nvlink"][P2P][SIMPLE]
    assert ph.time_s[0] == pytest.approx(lat + (n - 1) / n * msg / 450e9)


def test_custom_all_reduce_one_shot_and_two_shot() -> None:
    hw = load_hardware("h100_sxm")
    bw, barrier = 450e9, CUSTOM_AR_BARRIER_S["nvlink"]
    # 8 GPUs below 256 KiB: one-shot reads the whole buffer from 7 peers.
    t, _ = custom_allreduce_time_s(128 * 1024.0, 8, hw)
    assert t[0] == pytest.approx(CUSTOM_AR_LAUNCH_S + barrier + 7 * 128 * 1024 / bw)
    # 8 GPUs at 256 KiB: two-shot, 2 (n-1)/n of the buffer and two barriers.
    t, _ = custom_allreduce_time_s(256 * 1024.0, 8, hw)
    assert t[0] == pytest.approx(CUSTOM_AR_LAUNCH_S + 2 * barrier + 1.75 * 256 * 1024 / bw)
    # 4 GPUs keep one-shot up to 512 KiB; 2 GPUs always.
    t4, _ = custom_allreduce_time_s(384 * 1024.0, 4, hw)
    assert t4[0] == pytest.approx(CUSTOM_AR_LAUNCH_S + barrier + 3 * 384 * 1024 / bw)
    t2, _ = custom_allreduce_time_s(64 * MIB, 2, hw)
    assert t2[0] == pytest.approx(CUSTOM_AR_LAUNCH_S + barrier + 64 * MIB / bw)


def test_shipped_nvlink_tables() -> None:
    for name, links, per_link, nvls in (("a100_sxm", 12, 25e9, False), ("h100_sxm", 18, 25e9, True),
                                        ("b200_sxm", 18, 50e9, True), ("gb200", 18, 50e9, True)):
        nv = load_hardware(name).nvlink
        assert nv is not None and (nv.links_per_gpu, nv.link_bandwidth_bytes_per_s, nv.nvls) == (links, per_link, nvls)
    assert load_hardware("l40s").nvlink is None


@pytest.mark.parametrize(("edit", "key"), [
    (("links_per_gpu = 18", "links_per_gpu = 12"), "nvlink.links_per_gpu"),  # 12 x 25 GB/s != 450 GB/s
    (("switch_generation = 3", "switch_generation = 2"), "nvlink.nvls"),  # NVLS needs a gen-3 switch
    (("generation = 4\n", "generation = 9\n"), "nvlink.generation"),
    (("nvls = true", "nvls = 1"), "nvlink.nvls"),
    (("nvls = true", "nvls = true\nlanes = 4"), "nvlink.lanes"),
    (('kind = "nvlink"', 'kind = "pcie"'), "nvlink"),
])
def test_bad_nvlink_table_names_the_key(tmp_path: Path, edit: tuple[str, str], key: str) -> None:
    text = (_data_dir() / "hardware" / "h100_sxm.toml").read_text()
    assert edit[0] in text
    path = tmp_path / "gpu.toml"
    path.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    # Errors of the nested table are reported on `nvlink` (the table, with its values) or its key.
    assert err.value.key in (key, "nvlink")
    assert key.split(".")[-1] in str(err.value)
    assert str(path) in str(err.value)


def test_pcie_collectives_across_peer_groups_pass_through_host_memory() -> None:
    """On a node whose GPUs are P2P in pairs, a ring over 4 or 8 of them crosses 2 or 4 pairs, each
    crossing through a host buffer (PCIe twice) on a host path they share; without a peer group the
    baseline is the one the fitted families were fitted on."""
    hw = load_hardware("l40s")
    msg = 64 * MIB
    for n, crossings in ((4, 2), (8, 4)):
        paired, flat = nccl_time("all_reduce", msg, n, hw, 2), nccl_time("all_reduce", msg, n, hw, 8)
        assert (int(paired.algo[0]), int(paired.proto[0])) == (RING, SIMPLE)
        host_bw = 32e9 / (2 * crossings)
        assert paired.time_s[0] == pytest.approx(paired.latency_s[0] + 2 * (n - 1) / n * msg / host_bw)
        assert flat.time_s[0] == pytest.approx(flat.latency_s[0] + 2 * (n - 1) / n * msg / 32e9)
        assert nccl_time("all_reduce", msg, n, hw).time_s[0] == flat.time_s[0]
    # Inside one peer group, on NVLink, and across nodes nothing changes.
    assert nccl_time("all_reduce", msg, 2, hw, 2).time_s[0] == nccl_time("all_reduce", msg, 2, hw, 8).time_s[0]
    assert nccl_time("all_reduce", msg, 16, hw, 2).time_s[0] == nccl_time("all_reduce", msg, 16, hw, 8).time_s[0]
    h100 = load_hardware("h100_sxm")
    assert nccl_time("all_reduce", msg, 8, h100, 1).time_s[0] == nccl_time("all_reduce", msg, 8, h100).time_s[0]


def test_a_node_wired_otherwise_than_the_tables_host_moves_only_its_collectives(tmp_path: Path) -> None:
    """The fitted collectives describe the host the tables were measured on (l40s: pairs); a node
    with P2P across its GPUs prices them by the baselines' ratio, in both tiers and both paths."""
    paired = load_hardware("l40s")
    assert (paired.pcie_peer_group_size, paired.tables_pcie_peer_group_size) == (2, 2)
    flat = dataclasses.replace(paired, pcie_peer_group_size=8)
    assert flat.tables_pcie_peer_group_size == 2
    np.testing.assert_array_equal(topology_log_factor("all_reduce", [1e6, 1e8], 8, paired), [0.0, 0.0])
    for tier in ("cross-generation", "target-measured"):
        model = efficiency_model_for(paired, tier=tier, backend="trtllm")
        works = [KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=4 * MIB,
                            group_size=n) for n in (2, 4, 8)]
        before = [model.efficiency(w, paired).value for w in works]
        after = [model.efficiency(w, flat).value for w in works]
        assert after[0] == before[0]  # one peer group: no crossing either way
        ratio = [a / b for a, b in zip(after, before, strict=True)]
        expected = np.exp(-topology_log_factor("all_reduce", 4 * MIB, np.array([4.0, 8.0]), flat))
        assert ratio[1:] == pytest.approx(list(expected)) and ratio[2] > ratio[1] > 2.0
        sizes = [KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=b,
                            group_size=8) for b in (4 * MIB, 64 * MIB)]
        cols, _ = model.efficiency_columns(KernelColumns.of(sizes), flat)
        assert list(cols) == pytest.approx([model.efficiency(w, flat).value for w in sizes], rel=1e-12)
    # A hardware TOML of a P2P server that keeps the tables' host prices the same as the override.
    model = efficiency_model_for(paired, tier="cross-generation", backend="trtllm")
    text = (_data_dir() / "hardware" / "l40s.toml").read_text().replace("\npcie_peer_group_size = 2",
                                                                     "\npcie_peer_group_size = 8", 1)
    own = tmp_path / "l40s_p2p.toml"
    own.write_text(text)
    ar8 = KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=4 * MIB, group_size=8)
    assert model.efficiency(ar8, load_hardware(str(own))).value == model.efficiency(ar8, flat).value
    # RTX PRO 6000's tables host has P2P across the node: pairs cost more there.
    rtx = load_hardware("rtx_pro_6000_server")
    rtx_model = efficiency_model_for(rtx, tier="cross-generation", backend="trtllm")
    paired_rtx = dataclasses.replace(rtx, pcie_peer_group_size=2)
    assert rtx_model.efficiency(ar8, paired_rtx).value < 0.5 * rtx_model.efficiency(ar8, rtx).value
    # GEMMs do not care how the PCIe fabric is wired.
    gemm = KernelWork(kind=KernelKind.GEMM, name="g", dtype=DType.BFLOAT16, flops=2.0 * 256 * 4096 * 4096,
                      weight_bytes=2.0 * 4096 * 4096, activation_bytes=4.0 * 256 * 4096, shape=(256, 4096, 4096))
    model = efficiency_model_for(paired, tier="cross-generation", backend="trtllm")
    assert model.efficiency(gemm, flat).value == model.efficiency(gemm, paired).value


def test_pcie_gpus_without_tables_declare_the_wiring_their_collectives_share() -> None:
    """A catalog PCIe GPU without kernel tables states the wiring of the tables' host whose fitted
    collectives it gets (the residual tells PCIe hosts apart by link bandwidth): its all-reduce must
    equal that host's GPU's, or the stated wiring is stale after a refit."""
    hosts = {load_hardware(g).intra_node_link.bandwidth_bytes_per_s: load_hardware(g)
             for g in ("l40s", "rtx_pro_6000_server")}

    def bus_bw(hw: HardwareSpec, n: int) -> float:
        model = efficiency_model_for(hw, tier="cross-generation", backend="trtllm")
        work = KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=4 * MIB,
                          group_size=n)
        return model.efficiency(work, hw).value * hw.intra_node_link.bandwidth_bytes_per_s

    for name in ("a100_pcie", "a30", "l4", "rtx_4090", "h100_pcie"):
        hw = load_hardware(name)
        host = hosts[hw.intra_node_link.bandwidth_bytes_per_s]
        assert hw.tables_pcie_peer_group_size == host.tables_pcie_peer_group_size, name
        for n in (2, 4, 8):
            assert bus_bw(hw, n) == pytest.approx(bus_bw(host, n), rel=0.01), (name, n)


def test_a_collective_over_pcie_nodes_costs_at_least_one_nodes_collective() -> None:
    """TP 16 over two L40S nodes of GPU pairs runs a ring through both nodes' host-memory crossings:
    the fitted model's extrapolation to the network link alone must not price it below TP 8 in one
    node. NVLink nodes, whose network hop is the slow one, are untouched."""
    def time_s(hw: HardwareSpec, n: int, kind: KernelKind = KernelKind.ALL_REDUCE) -> float:
        work = KernelWork(kind=kind, name="c", dtype=DType.BFLOAT16, comm_bytes=4 * MIB, group_size=n)
        model = efficiency_model_for(hw, tier="cross-generation", backend="trtllm")
        value = model.efficiency(work, hw).value
        cols, _ = model.efficiency_columns(KernelColumns.of([work]), hw)
        assert cols[0] == pytest.approx(value, rel=1e-12)
        return roofline(work, hw).network_s / value

    paired = load_hardware("l40s")
    for kind in (KernelKind.ALL_REDUCE, KernelKind.ALL_GATHER):
        assert time_s(paired, 16, kind) >= time_s(paired, 8, kind) * (1 - 1e-12)
    flat = dataclasses.replace(paired, pcie_peer_group_size=8)
    assert time_s(flat, 16) > time_s(flat, 8)
    h100 = load_hardware("h100_sxm")
    assert node_floor_ratio(KernelKind.ALL_REDUCE, 16, h100) is None
    assert node_floor_ratio(KernelKind.SEND_RECV, 16, paired) is None
    assert node_floor_ratio(KernelKind.ALL_REDUCE, 8, paired) is None


@pytest.mark.parametrize(("value", "rule"), [(3, "must divide num_gpus_per_node"), (0, "must divide"),
                                              (16, "must divide")])
def test_bad_pcie_peer_group_size_names_the_key(tmp_path: Path, value: int, rule: str) -> None:
    text = (_data_dir() / "hardware" / "l40s.toml").read_text()
    path = tmp_path / "gpu.toml"
    path.write_text(text.replace("pcie_peer_group_size = 2", f"pcie_peer_group_size = {value}", 1))
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    assert err.value.key == "pcie_peer_group_size" and rule in str(err.value) and str(path) in str(err.value)
    nvlink = (_data_dir() / "hardware" / "h100_sxm.toml").read_text()
    path.write_text(nvlink.replace("num_gpus_per_node = 8", "num_gpus_per_node = 8\npcie_peer_group_size = 4", 1))
    with pytest.raises(ConfigError) as err:
        load_hardware(str(path))
    assert err.value.key == "pcie_peer_group_size" and "PCIe nodes only" in str(err.value)


def test_fitted_collectives_price_on_top_of_the_baseline() -> None:
    """The shipped model's residual is small where the baseline is good (H100 NVLink all-reduce),
    and a simulator kernel and a predict-kernels row get the same time."""
    from sim.calibration.batch import predict_latency_s
    from sim.calibration.select import efficiency_model_for
    from sim.perf.fitted import FittedEfficiency
    from sim.perf.roofline import roofline

    hw = load_hardware("h100_sxm")
    model = efficiency_model_for(hw, tier="cross-generation")
    assert isinstance(model, FittedEfficiency)
    assert len(model.families()["nccl"].ranges) == len(feature_names("nccl"))
    work = KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=16 * MIB, group_size=8)
    t_sim = roofline(work, hw).time_s() / model.efficiency(work, hw).value
    cols = {"kernel": np.array(["nccl_all_reduce"], dtype=object), "message_bytes": np.array([16 * MIB]),
            "num_gpus": np.array([8.0])}
    t_row, _ = predict_latency_s(cols, hw, model)
    assert t_sim == pytest.approx(float(t_row[0]), rel=1e-6)
    base = float(nccl_time("all_reduce", 16 * MIB, 8, hw).time_s[0])
    assert 0.5 < t_sim / base < 2.0


@pytest.mark.parametrize("msg_bytes", [64 * 1024, 1 * MIB, 64 * MIB])
def test_sglang_all_reduce_on_nvlink_takes_the_faster_of_nccl_and_its_own_kernel(msg_bytes: int) -> None:
    """SGLang runs its custom all-reduce on NVLink where it beats NCCL: the simulator prices the
    all-reduce as the faster of the two measured families' predictions, in both pricing paths; other
    engines and PCIe groups keep NCCL's."""
    from sim.calibration.batch import predict_latency_s
    from sim.calibration.select import efficiency_model_for
    from sim.perf.efficiency import KernelColumns
    from sim.perf.fitted import FittedEfficiency
    from sim.perf.roofline import roofline

    hw = load_hardware("h100_sxm")
    sglang = efficiency_model_for(hw, tier="cross-generation", backend="sglang")
    vllm = efficiency_model_for(hw, tier="cross-generation", backend="vllm")
    assert isinstance(sglang, FittedEfficiency) and isinstance(vllm, FittedEfficiency)
    work = KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=msg_bytes, group_size=8)
    base = roofline(work, hw).time_s()
    t_sglang = base / sglang.efficiency(work, hw).value
    t_vllm = base / vllm.efficiency(work, hw).value
    rows = {"kernel": np.array(["nccl_all_reduce", "custom_allreduce"], dtype=object),
            "message_bytes": np.array([float(msg_bytes)] * 2), "num_gpus": np.array([8.0, 8.0]),
            "variant": np.array(["", "sglang_graph"], dtype=object),
            "backend": np.array(["", "sglang"], dtype=object)}
    t_rows, _ = predict_latency_s(rows, hw, sglang)
    # SGLang hands buffers over 8 MiB (`_MAX_CAR_SIZE`) to NCCL.
    expected = min(float(t_rows[0]), float(t_rows[1])) if msg_bytes <= 8 * MIB else float(t_rows[0])
    assert t_sglang == pytest.approx(expected, rel=1e-6)
    assert t_vllm == pytest.approx(float(t_rows[0]), rel=1e-6)
    assert t_sglang <= t_vllm * (1 + 1e-9)
    values, _ = sglang.efficiency_columns(KernelColumns.of([work, work]), hw)
    assert values.tolist() == [sglang.efficiency(work, hw).value] * 2
    pcie = load_hardware("l40s")
    on_pcie = KernelWork(kind=KernelKind.ALL_REDUCE, name="ar", dtype=DType.BFLOAT16, comm_bytes=msg_bytes,
                         group_size=4)
    assert (efficiency_model_for(pcie, tier="cross-generation", backend="sglang").efficiency(on_pcie, pcie).value
            == efficiency_model_for(pcie, tier="cross-generation", backend="vllm").efficiency(on_pcie, pcie).value)
    # An NVL72 rack's 8 GPUs span two 4-GPU trays: SGLang's custom all-reduce is off across nodes.
    rack = load_hardware("gb200")
    assert rack.link_for_group(8).kind == "nvlink" and rack.num_gpus_per_node == 4
    assert (efficiency_model_for(rack, tier="cross-generation", backend="sglang").efficiency(work, rack).value
            == efficiency_model_for(rack, tier="cross-generation", backend="vllm").efficiency(work, rack).value)
