"""The loss plot's unit (toolkit.report.plots.loss_scale): bits per byte as the card shows them, never bits per
token under that label."""

from __future__ import annotations

import math

import pytest

from toolkit.events import EvalEvent
from toolkit.report.plots import loss_scale


def test_a_byte_level_run_is_drawn_in_bits_per_byte_at_one_over_ln_2():
    scale, unit = loss_scale([EvalEvent(step=10, val_loss=2.0, val_bpb=2.0 / math.log(2))])
    assert unit == "bits per byte" and scale == pytest.approx(1 / math.log(2))


def test_a_bpe_run_is_drawn_in_the_same_bits_per_byte_as_its_card_not_bits_per_token():
    # 2.3 bytes per token: 4.31 nats per token are 6.22 bits per token and 2.70 bits per byte
    evals = [EvalEvent(step=10, val_loss=4.31, val_bpb=4.31 / math.log(2) / 2.3)]
    scale, unit = loss_scale(evals)
    assert unit == "bits per byte"
    assert evals[0].val_loss * scale == pytest.approx(evals[0].headline) == pytest.approx(2.70, abs=0.01)


def test_without_bits_per_byte_the_loss_stays_in_nats():
    assert loss_scale([EvalEvent(step=10, val_loss=0.5)]) == (1.0, "loss (nats)")
    assert loss_scale([]) == (1.0, "loss (nats)")


def test_from_the_runs_start_the_plot_is_in_bits_per_byte_before_any_evaluation():
    from toolkit.events import StatusEvent

    started = [StatusEvent(state="running", bytes_per_token=2.3)]
    scale, unit = loss_scale([], started)
    assert unit == "bits per byte" and 4.31 * scale == pytest.approx(2.71, abs=0.01)
    assert loss_scale([], [StatusEvent(state="running")]) == (1.0, "loss (nats)"), "not text: nats"
