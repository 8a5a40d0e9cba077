"""The doctor's reading of the NCCL environment (toolkit.resources.nccl_env): each rule on a setting that slows or
breaks collectives, and silence on the settings that do neither."""

import pytest

from toolkit.resources.nccl_env import findings, summary

NET = frozenset({"lo", "eth0", "ib0"})
IB = frozenset({"mlx5_0"})


def texts(env, interfaces=NET, infiniband=IB):
    return findings(env, interfaces=interfaces, infiniband=infiniband)


@pytest.mark.parametrize("value", ["eth", "eth0", "=eth0", "eth,ib", "^docker"])
def test_a_socket_interface_that_exists_or_an_exclusion_is_fine(value):
    assert texts({"NCCL_SOCKET_IFNAME": value}) == []


@pytest.mark.parametrize("value", ["enp1s0", "=eth", "bond0,enp"])
def test_a_socket_interface_that_matches_nothing_here_fails(value):
    ((level, text),) = texts({"NCCL_SOCKET_IFNAME": value})
    assert level == "fail" and f"NCCL_SOCKET_IFNAME={value} matches no network interface here" in text
    assert "eth0, ib0, lo" in text


def test_turning_infiniband_off_warns_only_where_there_is_infiniband():
    ((level, text),) = texts({"NCCL_IB_DISABLE": "1"})
    assert level == "warn" and "mlx5_0" in text and "TCP sockets" in text
    assert texts({"NCCL_IB_DISABLE": "1"}, infiniband=frozenset()) == []
    assert texts({"NCCL_IB_DISABLE": "0"}) == []


@pytest.mark.parametrize("name, words", [("NCCL_P2P_DISABLE", "NVLink"), ("NCCL_SHM_DISABLE", "shared memory")])
def test_disabled_transports_warn_when_on(name, words):
    ((level, text),) = texts({name: "1"})
    assert level == "warn" and text.startswith(f"{name}=1") and words in text
    assert texts({name: "0"}) == []


@pytest.mark.parametrize("old, new", [("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                                      ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT")])
def test_deprecated_names_are_named_with_their_replacement(old, new):
    ((level, text),) = texts({old: "1"})
    assert level == "warn" and text == f"{old} is a deprecated name: PyTorch's is {new} (set {new}=1 instead)"


def test_forced_algorithms_trace_logging_a_missing_topology_and_hidden_gpus_warn(tmp_path):
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_DEBUG": "TRACE",
           "NCCL_TOPO_FILE": str(tmp_path / "ndv4-topo.xml"), "CUDA_VISIBLE_DEVICES": ""}
    found = texts(env)
    assert [lv for lv, _ in found] == ["warn"] * 5
    assert {t.split("=")[0] for _, t in found} == set(env)
    (tmp_path / "ndv4-topo.xml").write_text("<system/>")
    assert len(texts(env)) == 4


def test_the_doctor_check_fails_on_the_worst_and_passes_on_harmless_settings():
    status, text, details = summary({"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "HOME": "/root"},
                                    interfaces=NET, infiniband=IB)
    assert status == "pass" and "2 NCCL setting(s)" in text
    assert details["settings"] == {"NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    status, text, details = summary({"NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "enp9"}, interfaces=NET,
                                     infiniband=IB)
    assert status == "fail" and text.startswith("NCCL_SOCKET_IFNAME=enp9") and "NCCL_P2P_DISABLE" in text
    assert summary({}, interfaces=NET, infiniband=IB)[:2] == ("pass", "no NCCL_* settings: NCCL chooses transports "
                                                                       "itself")
