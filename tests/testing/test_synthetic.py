"""The synthetic conversation: deterministic, and with the structure diarization needs
(several voices, turns of varied length, silences, overlaps)."""

from __future__ import annotations

import numpy as np
import pytest

from pyspk.testing.synthetic import recording


@pytest.fixture(scope="module")
def made():
    return recording(300, seed=0)


def test_same_arguments_give_the_same_samples(made):
    again = recording(300, seed=0)
    assert np.array_equal(made.waveform, again.waveform)
    assert made.turns == again.turns
    assert not np.array_equal(made.waveform, recording(300, seed=1).waveform)


def test_samples_are_float32_mono_in_range(made):
    assert made.waveform.dtype == np.float32
    assert made.waveform.shape == (300 * 16_000,)
    assert made.seconds == 300
    assert 0.4 < float(np.max(np.abs(made.waveform))) <= 0.5


def test_turns_have_voices_lengths_silences_and_overlaps(made):
    speakers = {turn.speaker for turn in made.turns}
    assert speakers == {"voice0", "voice1", "voice2", "voice3"}
    lengths = np.array([turn.end - turn.start for turn in made.turns])
    assert lengths.min() >= 0.2 and lengths.max() > 4 * lengths.min()
    assert all(0 <= turn.start < turn.end <= 300 for turn in made.turns)
    assert made.silence_seconds() > 10
    assert made.overlap_seconds() > 5


def test_voices_sound_where_they_speak_and_not_elsewhere(made):
    rate = made.sample_rate
    silent = np.ones(len(made.waveform), dtype=bool)
    for turn in made.turns:
        silent[round(turn.start * rate) : round(turn.end * rate)] = False
    loud = np.abs(made.waveform[~silent]).mean()
    quiet = np.abs(made.waveform[silent]).mean()
    assert loud > 20 * quiet  # the background noise is 0.3% of a voice


def test_powerset_targets_number_local_speakers_by_first_turn():
    made = recording(60, seed=2)
    starts = np.array([0.0, 20.0])
    targets = made.powerset_targets(starts, frames=589, duration=10.0)
    assert targets.shape == (2, 589) and targets.dtype == np.int64
    assert set(np.unique(targets)) <= set(range(7))
    times = (np.arange(589) + 0.5) * 10.0 / 589
    for row, start in enumerate(starts):
        spoken = [
            turn
            for turn in made.turns
            if turn.end > start + times[0] and turn.start < start + times[-1]
        ]
        first = min(spoken, key=lambda turn: turn.start)
        inside = (times + start >= first.start) & (times + start < first.end)
        # speaker 0 of the chunk is the first voice: class 1 (alone) or 4, 5 (a pair with it)
        assert np.isin(targets[row, inside], (1, 4, 5)).all()
        nobody = np.ones(589, dtype=bool)
        for turn in spoken:
            nobody &= ~((times + start >= turn.start) & (times + start < turn.end))
        assert (targets[row, nobody] == 0).all()


@pytest.mark.parametrize(("seconds", "speakers"), [(0, 4), (-1, 4), (10, 1)])
def test_bad_arguments_are_refused(seconds, speakers):
    with pytest.raises(ValueError):
        recording(seconds, speakers=speakers)
