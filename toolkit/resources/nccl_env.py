"""The NCCL (and torch's NCCL) environment a run would start with, read for settings that slow or break collectives.

    findings(os.environ, interfaces=network_interfaces(), infiniband=infiniband_devices())

Each rule is a (variable, test, level, why) entry in :data:`RULES`; a finding is (level, text), level "warn" (the run
works, slower or noisier than it should) or "fail" (NCCL will not start as set). The doctor's ``nccl-env`` check
shows them; nothing here changes the environment. Sources: NCCL's environment-variable documentation and PyTorch's
ProcessGroupNCCL (the TORCH_NCCL_* names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Mapping


@dataclass(frozen=True)
class Machine:
    interfaces: frozenset[str]  # network interfaces (/sys/class/net)
    infiniband: frozenset[str]  # InfiniBand / RoCE devices (/sys/class/infiniband)


def network_interfaces() -> frozenset[str]:
    return _names(Path("/sys/class/net"))


def infiniband_devices() -> frozenset[str]:
    return _names(Path("/sys/class/infiniband"))


def _names(folder: Path) -> frozenset[str]:
    try:
        return frozenset(p.name for p in folder.iterdir())
    except OSError:
        return frozenset()


def _on(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _interfaces_missing(value: str, machine: Machine) -> str | None:
    """NCCL_SOCKET_IFNAME: a comma list of prefixes ('eth' matches eth0), '=' for exact names, '^' to exclude.
    None when an interface matches (or the value only excludes); else what was asked for."""
    spec = value.strip()
    if not spec or spec.startswith("^"):
        return None
    exact = spec.startswith("=")
    wanted = [w for w in spec.lstrip("=").split(",") if w]
    match = (lambda w, i: i == w) if exact else (lambda w, i: i.startswith(w))
    if any(match(w, i) for w in wanted for i in machine.interfaces):
        return None
    return spec


def _socket_ifname(value: str, machine: Machine) -> str | None:
    missing = _interfaces_missing(value, machine)
    if missing is None or not machine.interfaces:
        return None
    return (
        f"NCCL_SOCKET_IFNAME={missing} matches no network interface here "
        f"({', '.join(sorted(machine.interfaces))}): "
        f"NCCL cannot bootstrap and the first collective fails"
    )


def _ib_disabled(value: str, machine: Machine) -> str | None:
    if _on(value) and machine.infiniband:
        return (
            f"NCCL_IB_DISABLE={value} while this machine has InfiniBand ({', '.join(sorted(machine.infiniband))}): "
            f"traffic between nodes falls back to TCP sockets, many times slower"
        )
    return None


def _flag(text: str) -> Callable[[str, Machine], str | None]:
    def rule(value: str, machine: Machine) -> str | None:
        return text.format(value=value) if _on(value) else None

    return rule


def _set(text: str) -> Callable[[str, Machine], str | None]:
    def rule(value: str, machine: Machine) -> str | None:
        return text.format(value=value) if value.strip() else None

    return rule


def _renamed(new: str) -> Callable[[str, Machine], str | None]:
    def rule(value: str, machine: Machine) -> str | None:
        return f"is a deprecated name: PyTorch's is {new} (set {new}={value} instead)"

    return rule


def _debug(value: str, machine: Machine) -> str | None:
    if value.strip().upper() == "TRACE":
        return "NCCL_DEBUG=TRACE logs every call: slow, and logs of gigabytes on a long run (INFO or WARN instead)"
    return None


def _topo_file(value: str, machine: Machine) -> str | None:
    if value.strip() and not Path(value).is_file():
        return f"NCCL_TOPO_FILE={value} does not exist: NCCL falls back to detecting the topology itself"
    return None


def _visible_devices(value: str, machine: Machine) -> str | None:
    if value.strip() in ("", "-1", "none", "NoDevFiles"):
        return f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU: training runs on the CPU"
    return None


# (variable, rule, level): a rule returns why the value is a problem, or None.
RULES: list[tuple[str, Callable[[str, Machine], str | None], str]] = [
    ("NCCL_SOCKET_IFNAME", _socket_ifname, "fail"),
    ("NCCL_IB_DISABLE", _ib_disabled, "warn"),
    (
        "NCCL_P2P_DISABLE",
        _flag(
            "NCCL_P2P_DISABLE={value} turns off NVLink and PCIe peer-to-peer between GPUs: "
            "all-reduce goes through host memory, several times slower"
        ),
        "warn",
    ),
    (
        "NCCL_SHM_DISABLE",
        _flag(
            "NCCL_SHM_DISABLE={value} turns off shared memory between processes of one machine: "
            "slower all-reduce where peer-to-peer is not available"
        ),
        "warn",
    ),
    (
        "NCCL_ALGO",
        _set(
            "NCCL_ALGO={value} forces an algorithm NCCL would otherwise choose per message size: leave "
            "it unset unless a measurement says otherwise"
        ),
        "warn",
    ),
    (
        "NCCL_PROTO",
        _set(
            "NCCL_PROTO={value} forces a protocol NCCL would otherwise choose per message size: leave it "
            "unset unless a measurement says otherwise"
        ),
        "warn",
    ),
    ("NCCL_DEBUG", _debug, "warn"),
    ("NCCL_TOPO_FILE", _topo_file, "warn"),
    ("NCCL_ASYNC_ERROR_HANDLING", _renamed("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "warn"),
    ("NCCL_BLOCKING_WAIT", _renamed("TORCH_NCCL_BLOCKING_WAIT"), "warn"),
    ("NCCL_DESYNC_DEBUG", _renamed("TORCH_NCCL_DESYNC_DEBUG"), "warn"),
    ("CUDA_VISIBLE_DEVICES", _visible_devices, "warn"),
]


def findings(
    env: Mapping[str, str], interfaces: frozenset[str] | None = None, infiniband: frozenset[str] | None = None
) -> list[tuple[str, str]]:
    """(level, text) for each setting in ``env`` that slows or breaks collectives, worst first."""
    machine = Machine(
        network_interfaces() if interfaces is None else interfaces,
        infiniband_devices() if infiniband is None else infiniband,
    )
    found = []
    for name, rule, level in RULES:
        if name in env and (why := rule(env[name], machine)):
            found.append((level, why if why.startswith(name) else f"{name} {why}"))
    return sorted(found, key=lambda f: f[0] != "fail")


def nccl_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The NCCL_* and TORCH_NCCL_* variables set, for the report."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(("NCCL_", "TORCH_NCCL_"))}


def summary(env: Mapping[str, str] = os.environ, **machine) -> tuple[str, str, dict]:
    """The doctor check's (status, summary, details)."""
    found = findings(env, **machine)
    details = {"settings": nccl_settings(env), "findings": [{"level": lv, "text": t} for lv, t in found]}
    if found:
        worst = found[0][0]
        return worst, "; ".join(t for _, t in found), details
    settings = details["settings"]
    return (
        "pass",
        (
            f"{len(settings)} NCCL setting(s), none known to slow or break collectives"
            if settings
            else "no NCCL_* settings: NCCL chooses transports itself"
        ),
        details,
    )
