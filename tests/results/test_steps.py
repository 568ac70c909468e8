"""Step detection in histories of timings: a real step is found at its run, pure noise rarely gives one."""

from __future__ import annotations

import numpy as np

from parity.results.steps import detect, se_from_ci


def _noise(rng, n, sd=0.03):
    return np.exp(rng.normal(0.0, sd, n))


def test_a_five_percent_step_inside_three_percent_noise_is_found_at_its_run():
    rng = np.random.default_rng(7)
    values = _noise(rng, 40)
    values[24:] *= 1.05
    steps = detect(values)
    assert [s.index for s in steps] == [24]
    assert 1.03 < steps[0].ratio < 1.08 and steps[0].p < 0.01


def test_fifty_runs_of_pure_noise_give_no_step():
    assert detect(_noise(np.random.default_rng(3), 50)) == []


def test_false_alarms_on_pure_noise_stay_near_alpha_and_steps_are_found_where_they_are():
    rng = np.random.default_rng(11)
    alarms = sum(bool(detect(_noise(rng, 50), seed=k)) for k in range(150))
    assert alarms / 150 <= 0.04
    # a 10 % step in 3 % noise (heavy-tailed noise too): found, within a run of where it is
    found = 0
    for k in range(40):
        values = np.exp(0.03 * rng.standard_t(4, 30) / np.sqrt(2))
        values[18:] *= 1.10
        found += any(abs(s.index - 18) <= 1 for s in detect(values, seed=k))
    assert found >= 36


def test_a_tight_ci_on_a_noisy_history_is_not_over_trusted():
    # runs vary by 3 % between them while each claims a +-0.1 % CI: the between-run variation sets the weights
    rng = np.random.default_rng(5)
    values = _noise(rng, 40)
    ses = [se_from_ci(v, v * 0.999, v * 1.001) for v in values]
    assert detect(values, ses) == []


def test_a_slowdown_and_a_later_recovery_are_two_steps():
    rng = np.random.default_rng(2)
    values = _noise(rng, 45, 0.02)
    values[15:30] *= 1.2
    assert [s.index for s in detect(values)] == [15, 30]
