"""How nodes and ranks agree without files: a real TCP store on 127.0.0.1, the peers as threads of this process."""

from __future__ import annotations

import threading

import pytest

from toolkit.checkpoint.peers import PeerReports
from toolkit.ports import free_port_pair, port_in_use
from toolkit.runs.job import command_line
from toolkit.runs.nodes import NodeGroup, NodeSpec
from toolkit.runs.supervisor import decide


def _on_every_node(count: int, body) -> list:
    """Run ``body(group)`` on ``count`` nodes at once (threads); their results in node order."""
    port = free_port_pair()
    results: list = [None] * count
    errors: list = []

    def node(rank: int) -> None:
        try:
            with NodeGroup(NodeSpec(rank, count, "127.0.0.1", port), join_timeout_s=30, lost_after_s=30) as group:
                results[rank] = body(group)
        except Exception as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(count)]
    threads[0].start()
    while not port_in_use("127.0.0.1", port):  # a client that finds no server yet backs off for seconds
        threading.Event().wait(0.01)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_every_node_gets_every_value_in_node_order_and_node_0_decides():
    def body(group):
        first = group.exchange("hello", {"node": group.spec.rank})
        second = group.exchange("hello", {"again": group.spec.rank * 10})  # a second step under the same name
        decision = group.agree("vote", {"code": group.spec.rank}, lambda values: {"max": max(v["code"] for v in values)})
        return first, second, decision

    results = _on_every_node(3, body)
    for first, second, decision in results:
        assert first == [{"node": 0}, {"node": 1}, {"node": 2}]
        assert second == [{"again": 0}, {"again": 10}, {"again": 20}]
        assert decision == {"max": 2}


def _peers(world: int):
    """Ranks reporting through a store, as torchrun's workers do (MASTER_ADDR/MASTER_PORT name it)."""
    import torch.distributed as dist
    from datetime import timedelta

    port = free_port_pair()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    return server, port, [PeerReports(r, world) for r in range(world)]


@pytest.fixture
def master_env(monkeypatch):
    def set_port(port: int) -> None:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
    return set_port


def test_rank_0_gathers_every_ranks_files_and_the_store_keeps_none(master_env):
    server, port, ranks = _peers(3)
    master_env(port)
    for r in (1, 2):
        ranks[r].report(40, {f"rank_{r}.pt": {"size": r}})
    files = ranks[0].gather(40, {"model.pt": {"size": 9}}, timeout_s=5)
    assert files == {"model.pt": {"size": 9}, "rank_1.pt": {"size": 1}, "rank_2.pt": {"size": 2}}
    assert not server.check(["trainbook/checkpoint/40/rank_00001"])


def test_a_rank_that_failed_to_write_is_named_at_once(master_env):
    server, port, ranks = _peers(3)
    master_env(port)
    ranks[1].report(40, {"rank_1.pt": {}})
    ranks[2].report_failure(40, "OSError: No space left on device")
    with pytest.raises(RuntimeError, match="rank 2: OSError: No space left on device"):
        ranks[0].gather(40, {}, timeout_s=5)


def test_a_rank_that_never_reports_is_named_after_the_timeout(master_env):
    server, port, ranks = _peers(3)
    master_env(port)
    ranks[2].report(40, {})
    with pytest.raises(TimeoutError, match=r"no report from rank 1 after"):
        ranks[0].gather(40, {}, timeout_s=0.3)


@pytest.mark.parametrize("outcomes, restarts, want", [
    ([{"code": 0, "stopping": False, "completed": True}] * 2, 0, {"code": 0, "end": True, "node": None}),
    # node 1's rank crashed, node 0's ended with it: restart both, the failure is node 1's
    ([{"code": 1, "stopping": False, "completed": False}, {"code": -9, "stopping": False, "completed": False}], 0,
     {"code": 1, "end": False, "node": 0}),
    ([{"code": 0, "stopping": False, "completed": False}, {"code": -9, "stopping": False, "completed": False}], 0,
     {"code": -9, "end": False, "node": 1}),
    ([{"code": 0, "stopping": False, "completed": False}, {"code": -9, "stopping": False, "completed": False}], 2,
     {"code": -9, "end": True, "node": 1}),  # out of restarts
    ([{"code": -15, "stopping": False, "completed": False}, {"code": -15, "stopping": True, "completed": False}], 0,
     {"code": -15, "end": True, "node": 0}),  # a stop on any node ends every node
    # node 0's rank 0 said a restart would repeat the failure (the watchdog stopped at a non-finite step)
    ([{"code": 1, "stopping": False, "completed": False, "no_restart": "a non-finite step"},
      {"code": 1, "stopping": False, "completed": False, "no_restart": None}], 0, {"code": 1, "end": True, "node": 0}),
])
def test_after_an_attempt_every_node_restarts_or_ends_together(outcomes, restarts, want):
    got = decide(outcomes, restarts, max_restarts=2)
    assert {k: got[k] for k in want} == want


def test_the_job_command_leaves_azure_expressions_for_azure_and_quotes_the_rest():
    line = command_line("${{outputs.runs}}/my run", config="${{inputs.config}}", nnodes=2, max_restarts=3,
                        sets={"data.path": "${{inputs.data}}", "name": "a b"})
    assert line == ("python -m toolkit.runs.job ${{outputs.runs}}/my run --config ${{inputs.config}} --nnodes 2 "
                    "--max-restarts 3 --set data.path=${{inputs.data}} --set 'name=a b'")


def test_only_the_attempt_that_forbade_a_restart_is_not_restarted():
    from toolkit.status import restart_forbidden

    status = {"no_restart": {"attempt": 2, "reason": "a non-finite step"}}
    assert restart_forbidden(status, 2) == "a non-finite step"
    assert restart_forbidden(status, 3) is None  # an earlier attempt's word, before a resume
    assert restart_forbidden({}, 0) is None and restart_forbidden({"no_restart": "junk"}, 0) is None


def test_an_elastic_node_range_is_bounded_and_checked_at_a_constant_number_of_counts():
    import argparse

    from toolkit.runs.job import MAX_NODES, NodeRange, node_range

    assert node_range("2:4") == NodeRange(2, 4, True) and node_range("3") == NodeRange(3, 3, False)
    for text in ("1:1000000000000", f"1:{MAX_NODES + 1}", "0:2", "3:2", "1:" + "9" * 5000, "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--nnodes"):
            node_range(text)
    # both ends, and one node: a size dividing c x nproc and (c+1) x nproc divides nproc
    assert NodeRange(2, MAX_NODES, True).counts_to_check() == [1, 2, MAX_NODES]
    assert NodeRange(3, 3, False).counts_to_check() == [3]
