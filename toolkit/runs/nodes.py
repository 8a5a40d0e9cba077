"""The nodes of one multi-node job, and how they agree: a TCP store on node 0, a heartbeat per node.

Files on shared storage are no way to coordinate: a blob mount caches, so a file one node writes another may see
seconds later, or after its cache expires. The store answers at once, and tells a node that is gone from one
that is slow: every node bumps a counter every HEARTBEAT_S; a counter that has not moved for ``lost_after_s`` is a
lost node, and a store that cannot be reached is a lost node 0.

Everything here is a step all nodes take together: :meth:`NodeGroup.exchange` (each node gives a value, node 0
gathers them and every node gets the list back), built on keys named per step so that nothing is ever reused.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

HEARTBEAT_S = 1.0
POLL_S = 1.0  # how often a waiting node looks at the others' heartbeats


@dataclass(frozen=True)
class NodeSpec:
    """Where this node stands in the job."""

    rank: int
    """This node's index, 0 first (NODE_RANK)."""
    count: int
    """Nodes in the job."""
    addr: str
    """Node 0's address (MASTER_ADDR)."""
    port: int
    """The port of the nodes' store on node 0 (MASTER_PORT); the training ranks' rendezvous is on the next one."""

    @property
    def training_port(self) -> int:
        return self.port + 1


class NodeLost(RuntimeError):
    """A node stopped answering: the job cannot go on with the nodes it has."""


class NodeGroup:
    """This node's membership of the job (a context manager: the heartbeat stops on the way out)."""

    def __init__(self, spec: NodeSpec, *, join_timeout_s: float, lost_after_s: float):
        import torch.distributed as dist

        self.spec, self.lost_after_s = spec, lost_after_s
        try:
            # node 0 serves the store; the others connect, retrying until it is up (nodes start minutes apart)
            self.store = dist.TCPStore(
                spec.addr,
                spec.port,
                is_master=spec.rank == 0,
                wait_for_workers=False,
                timeout=timedelta(seconds=join_timeout_s),
            )
            self._beat_store = dist.TCPStore(
                spec.addr, spec.port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=lost_after_s)
            )
        except Exception as exc:  # noqa: BLE001 - the store's own error says little; say who and where
            raise NodeLost(
                f"cannot reach node 0's store at {spec.addr}:{spec.port} within {join_timeout_s:.0f} s ({exc})"
            ) from None
        self.store.set_timeout(timedelta(seconds=POLL_S))
        self._seen: dict[int, tuple[int, float]] = {}  # node -> (its heartbeat count, when it last moved)
        self._steps: dict[str, int] = {}
        self._stop = threading.Event()
        self._beat()
        self._thread = threading.Thread(target=self._beat_forever, name="trainbook-node-heartbeat", daemon=True)
        self._thread.start()
        self._join(join_timeout_s)

    def __enter__(self) -> NodeGroup:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            # node 0 serves the store: it leaves last, once every node has read the last step (a refusal or a failed
            # pre-flight too: each node reports it); after a lost node there is nobody to wait for
            if exc_type is None or not issubclass(exc_type, NodeLost):
                self._leave()
        finally:
            self._stop.set()
            self._thread.join()

    # --- heartbeats ----------------------------------------------------------------------------------------

    def _beat(self) -> None:
        self._beat_store.add(f"trainbook/alive/{self.spec.rank}", 1)

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - node 0 is gone: the main thread finds out at its next wait
                return

    def _check_alive(self, nodes: list[int]) -> None:
        """Raise NodeLost for the first of ``nodes`` whose heartbeat has not moved for lost_after_s."""
        now = time.monotonic()
        for node in nodes:
            count = self._call(self.store.add, f"trainbook/alive/{node}", 0)
            last = self._seen.get(node)
            if last is None or count != last[0]:
                self._seen[node] = (count, now)
            elif now - last[1] > self.lost_after_s:
                raise NodeLost(f"node {node} is lost: no heartbeat for {now - last[1]:.0f} s")

    def check_others(self) -> None:
        """Raise NodeLost if another node has gone quiet (or node 0's store is gone)."""
        self._check_alive([n for n in range(self.spec.count) if n != self.spec.rank])

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            if self.spec.rank != 0 and not _is_timeout(exc):
                raise NodeLost(
                    f"node 0 is lost: its store at {self.spec.addr}:{self.spec.port} is gone ({exc})"
                ) from None
            raise

    # --- steps all nodes take together ------------------------------------------------------------------------

    def _wait(self, keys: list[str], nodes: list[int], what: str) -> None:
        """Wait for ``keys`` (set by ``nodes``), checking every POLL_S that those nodes are alive."""
        self._wait_keys(keys, what, lambda: self._check_alive(nodes))

    def _wait_keys(self, keys: list[str], what: str, between) -> None:
        """Wait for ``keys``; ``between()`` runs every POLL_S meanwhile and raises to give up."""
        self._patiently(self.store.wait, (keys, timedelta(seconds=POLL_S)), what, between)

    def _patiently(self, fn, args: tuple, what: str, between):
        """``fn(*args)`` on the store, again after each of its POLL_S timeouts once ``between()`` has looked around
        (it raises to give up); any other store error is a lost node."""
        while True:
            try:
                return self._call(fn, *args)
            except NodeLost:
                raise
            except Exception as exc:  # noqa: BLE001 - a DistStoreError timeout: look around, try again
                if not _is_timeout(exc):
                    raise NodeLost(f"waiting for {what}: {exc}") from None
                between()

    def _join(self, timeout_s: float) -> None:
        """Every node says it is here; a node that never came is named after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        keys = [f"trainbook/alive/{n}" for n in range(self.spec.count)]

        def in_time() -> None:
            if time.monotonic() > deadline:
                missing = [str(n) for n, key in enumerate(keys) if not self.store.check([key])]
                raise NodeLost(f"node(s) {', '.join(missing)} did not join within {timeout_s:.0f} s")

        self._wait_keys(keys, "the nodes to join", in_time)

    def exchange(self, name: str, value: dict) -> list[dict]:
        """Every node gives ``value`` under ``name``; every node gets all of them back, in node order. Each call with
        a name is a new step (named ``name/1``, ``name/2``...), so calls must happen in the same order on every node."""
        self._steps[name] = step = self._steps.get(name, 0) + 1
        base = f"trainbook/exchange/{name}/{step}"
        self._call(self.store.set, f"{base}/{self.spec.rank}", json.dumps(value))
        if self.spec.rank == 0:
            others = list(range(1, self.spec.count))
            self._wait([f"{base}/{n}" for n in others], others, name)
            values = [json.loads(self.store.get(f"{base}/{n}")) for n in range(self.spec.count)]
            self._call(self.store.set, f"{base}/all", json.dumps(values))
            return values
        return json.loads(self._get(f"{base}/all", name))

    def _get(self, key: str, what: str) -> bytes:
        """Node 0's value under ``key``, as soon as it is set, in one call (node 0 may leave right after setting it),
        checking every POLL_S that node 0 is alive."""
        return self._patiently(self.store.get, (key,), what, lambda: self._check_alive([0]))

    def _leave(self) -> None:
        """Node 0 waits for every other node to say it is done with the store; the others say so and go."""
        if self.spec.rank != 0:
            self._call(self.store.set, f"trainbook/left/{self.spec.rank}", "1")
            return
        others = list(range(1, self.spec.count))
        self._wait([f"trainbook/left/{n}" for n in others], others, "the other nodes to leave")

    def agree(self, name: str, value: dict, decide) -> dict:
        """Every node gives ``value``; node 0 calls ``decide(values)`` and every node gets its result."""
        values = self.exchange(name, value)
        decision = self.exchange(f"{name}-decision", decide(values) if self.spec.rank == 0 else {})
        return decision[0]


def _is_timeout(exc: Exception) -> bool:
    return "timeout" in str(exc).lower() or "timed out" in str(exc).lower()
