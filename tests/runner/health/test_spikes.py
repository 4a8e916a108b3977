"""--loss-spike (runner/health/spikes.py): the window, the threshold, the warm-up, the state a
checkpoint carries. Pure logic. End to end: tests/integration/test_numerical_health.py."""

from __future__ import annotations

import numpy as np
import pytest

from resilient_train.errors import ConfigError
from resilient_train.job.config import JobConfig
from resilient_train.runner.health.detector import SPIKE, Anomaly
from resilient_train.runner.health.spikes import WINDOW, LossSpikes, Spike

NOISY = [float(v) for v in 1.0 + 0.1 * np.random.default_rng(0).standard_normal(3 * WINDOW)]


def test_no_detection_in_the_warm_up_then_a_100x_loss_is_found_at_its_step():
    spikes = LossSpikes(10)
    assert spikes.check([100.0] + NOISY[:WINDOW - 1]) is None  # the window is not full yet: nothing is judged
    spikes = LossSpikes(10)
    assert spikes.check(NOISY[:WINDOW]) is None
    found = spikes.check([NOISY[WINDOW], NOISY[WINDOW + 1], 100.0, 1.0])
    assert isinstance(found, Spike) and (found.offset, found.loss) == (2, 100.0)
    assert found.median == pytest.approx(float(np.median(NOISY[2:WINDOW + 2])))
    assert found.median < found.threshold < 100.0


def test_a_noisy_loss_that_does_not_leave_its_range_raises_nothing():
    assert LossSpikes(10).check(NOISY) is None
    falling = [2.0 * 0.995 ** k + 0.05 * np.sin(k) for k in range(1000)]  # a training curve
    assert LossSpikes(10).check(falling) is None


def test_a_flat_or_converged_loss_needs_twice_the_windows_largest():
    flat = [0.5] * WINDOW  # MAD 0
    assert LossSpikes(10).check([*flat, 0.99]) is None  # below twice the largest
    assert LossSpikes(10).check([*flat, 1.01]).offset == WINDOW
    converged = [0.01] * 90 + [0.05] * 10  # a converged classifier: a few batches at 5x the median
    assert LossSpikes(10).check([*converged, 0.1]) is None  # 10x the median is not a spike here
    assert LossSpikes(10).check([*converged, 0.11]).offset == WINDOW


def test_the_window_a_checkpoint_carries_gives_the_same_decisions_after_a_restore():
    first = LossSpikes(6)
    first.check(NOISY[:150])
    extra = first.to_extra()
    assert len(extra["loss_window"]) == WINDOW
    resumed = LossSpikes(6)
    resumed.load_extra(extra)
    later = [*NOISY[150:200], 9.0]
    restored = LossSpikes(6)
    restored.load_extra(extra)
    continuous = first.check(later)  # the run that was never interrupted
    assert continuous is not None and continuous.offset == 50
    assert restored.check(later) == continuous
    assert LossSpikes(6).check(later) is None  # without the window: still warming up, so it would miss it


def test_the_option_and_the_description():
    assert JobConfig(recipe="r.py").loss_spike == "off"
    assert JobConfig(recipe="r.py", loss_spike=8.0).loss_spike == 8.0
    with pytest.raises(ConfigError, match=r"^Received loss_spike=0; expected a number > 0 or 'off'$"):
        JobConfig(recipe="r.py", loss_spike=0)
    with pytest.raises(ValueError, match="Received k=-1"):
        LossSpikes(-1)
    anomaly = Anomaly(global_step=150, epoch=1, step_in_epoch=49, replicas=1, values={"loss": 51.5}, kind=SPIKE,
                      reference={"median": 1.0, "threshold": 1.6})
    assert anomaly.describe() == ("a loss spike at global step 150 (epoch 1, batch 49 of the epoch): loss=51.5 above "
                                  "1.6 (the last steps' median 1; --loss-spike)")
