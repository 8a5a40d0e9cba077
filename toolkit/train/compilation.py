"""train.compile: torch.compile of the model, and what compiling cost.

The model is compiled in place (``nn.Module.compile``, which is also what DeepSpeed's ``engine.compile()`` does): its
parameters and state_dict keep their names, so a checkpoint is the same with or without compiling and a run resumes
either way. Compiling is lazy: each new graph (training, evaluation under no_grad, a new batch shape) compiles at its
first forward, its backward at its first backward. Dynamo records each compile in
``torch._dynamo.utils.get_compilation_metrics()``; :class:`CompileWatch` reads the new records after each step and
turns them into a compile event: the seconds, the graphs, and each recompilation with dynamo's own reason.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import torch

from toolkit.errors import RefusedValue, not_allowed


def check(cfg, cuda: bool) -> None:
    """Before launch: what train.compile needs on the machine the run will use, a C++ compiler for a CPU's
    generated code, Triton for a GPU's. Raises ValueError naming the field."""
    if not cfg.train.compile:
        return
    if cuda:
        if importlib.util.find_spec("triton") is None:
            raise RefusedValue(
                not_allowed(
                    "train.compile",
                    True,
                    "false where Triton is not installed (torch's CUDA wheels bring it)",
                    problem="needs Triton to generate GPU kernels",
                )
            )
        return
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        raise RefusedValue(
            not_allowed(
                "train.compile",
                True,
                "false on a machine without a C++ compiler (install g++, or name yours in CXX)",
                problem=f"needs a C++ compiler for the CPU code it generates; {compiler} is not on PATH",
            )
        )


def compile_in_place(module: torch.nn.Module) -> None:
    """Compile ``module``'s forward, keeping the module (its names, its state_dict) as it is."""
    module.compile()


class CompileWatch:
    """After each step (:meth:`step_done`), the compiles since the last look, as a compile event's fields (or None).
    Every rank compiles the same graphs; rank 0's records are the run's."""

    def __init__(self):
        self._seen = {_record_id(m) for m in _records()}  # compiles before training (none, unless a test ran some)

    def step_done(self, step: int) -> dict | None:
        records = _records()
        if not records or _record_id(records[-1]) in self._seen:  # the common step: nothing compiled since
            return None
        new = [m for m in records if _record_id(m) not in self._seen]
        if not new:
            return None
        self._seen.update(_record_id(m) for m in new)
        forward = [m for m in new if m.co_name is not None]
        seconds = (
            sum(m.entire_frame_compile_time_s or 0.0 for m in forward)
            + sum(m.backward_cumulative_compile_time_us or 0 for m in new) / 1e6
        )
        reasons = [f"{m.co_name}: {m.recompile_reason.strip()}" for m in forward if m.recompile_reason]
        reasons += [f"{m.co_name or 'backward'} failed, ran eagerly: {m.fail_reason}" for m in new if m.fail_reason]
        return {
            "step": step,
            "seconds": round(seconds, 3),
            "graphs": len(forward),
            "recompiles": sum(1 for m in forward if m.recompile_reason),
            "reasons": reasons,
            "graph_breaks": sum(m.num_graph_breaks or 0 for m in forward),
        }


def _records() -> list:
    from torch._dynamo.utils import get_compilation_metrics

    return get_compilation_metrics()


def _record_id(m) -> tuple:
    return (str(m.compile_id), m.start_time_us, m.co_name)
