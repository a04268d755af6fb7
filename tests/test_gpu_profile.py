"""`tools/gpu_profile.py`'s accounting of kernel intervals, on cases worked by hand."""

from __future__ import annotations

import pytest

from tools.gpu_profile import alone, busy


def test_a_family_alone_is_its_time_with_no_other_family_running():
    """A trunk kernel over 0-10 µs and another over 12-14, the LSTM over 5-20: the trunk
    runs alone over 0-5, the LSTM over 10-12 and 14-20; busy is 0-20."""
    intervals = [
        ("spk_trunk_layer1_tiles_f16x3", 0.0, 10.0),
        ("RNN_blockPersist_fp_LSTM", 5.0, 20.0),
        ("spk_trunk_layer2_conv_f16x3", 12.0, 14.0),
    ]
    found = alone(intervals)
    assert found["trunk"] == pytest.approx(5.0)
    assert found["cudnn lstm"] == pytest.approx(8.0)
    assert busy(intervals) == pytest.approx(20.0)


def test_kernels_of_one_family_overlapping_count_once_and_gaps_count_for_none():
    intervals = [
        ("spk_trunk_stem", 0.0, 4.0),
        ("spk_trunk_layer1_tiles_f16", 2.0, 6.0),
        ("spk_sinc_front", 8.0, 9.0),
    ]
    found = alone(intervals)
    assert found["trunk"] == pytest.approx(6.0)
    assert found["pyspk sincnet"] == pytest.approx(1.0)
    assert sum(found.values()) == pytest.approx(busy(intervals))
