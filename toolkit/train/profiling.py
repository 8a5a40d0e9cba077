"""torch.profiler over a few steps: a trace TensorBoard's profiler plugin opens, and a plain-text summary.

The plugin (torch-tb-profiler) is deprecated upstream, so the raw Chrome/Perfetto trace and summary.txt are
the durable outputs; the plugin is a convenience on top.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from toolkit.fsio import atomic_write_text
from toolkit.rundir import OPERATORS_FILE

SUMMARY_ROWS = 25


class StepProfiler:
    """Call ``step()`` once per training step; records steps [wait + warmup, wait + warmup + active)."""

    def __init__(self, cfg, out_dir: Path, worker_name: str, on_summary=None):
        self.out_dir = out_dir
        self.on_summary = on_summary
        self.summary_path = out_dir / "summary.txt"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        trace_handler = tensorboard_trace_handler(str(out_dir), worker_name=worker_name)

        def on_trace_ready(prof):
            trace_handler(prof)
            self._write_summary(prof)

        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1),
            on_trace_ready=on_trace_ready,
            record_shapes=True,
        )
        self._prof.start()
        self._open = True

    def _write_summary(self, prof):
        # on a GPU by the kernels' own time (self_cuda_time_total is its deprecated alias since torch 2.4)
        sort_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        averages = prof.key_averages()
        table = averages.table(sort_by=sort_key, row_limit=SUMMARY_ROWS)
        self.summary_path.write_text(table + "\n")
        ranked = sorted(averages, key=lambda e: getattr(e, sort_key), reverse=True)[:SUMMARY_ROWS]
        total_us = sum(e.self_cpu_time_total for e in averages) or 1.0
        rows = [
            {
                "name": e.key,
                "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
                "self_cpu_pct": round(100 * e.self_cpu_time_total / total_us, 2),
                "cpu_total_ms": round(e.cpu_time_total / 1e3, 3),
                "calls": e.count,
            }
            for e in ranked
        ]
        atomic_write_text(self.out_dir / OPERATORS_FILE, json.dumps(rows, indent=1) + "\n")  # never through a link
        top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:5]
        if self.on_summary:
            self.on_summary(
                {
                    "summary": str(self.summary_path),
                    "traces": sorted(p.name for p in self.out_dir.glob("*.pt.trace.json*")),
                    "top_ops": [
                        {"name": e.key, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3), "calls": e.count}
                        for e in top
                    ],
                }
            )

    def step(self):
        if self._open:
            self._prof.step()

    def close(self):
        if self._open:
            self._prof.stop()
            self._open = False
