"""`tools/corpus_model.py`'s schedule, on cases worked by hand."""

from __future__ import annotations

import pytest

from tools.corpus_model import makespan


@pytest.mark.parametrize("turns", [False, True])
def test_one_engine_does_everything_in_turn_and_no_host_work_keeps_the_gpu_busy(turns):
    gpu, host = [3.0, 2.0, 1.0], [0.5, 0.25, 0.125]
    assert makespan(gpu, host, 1, turns) == pytest.approx(6.875)
    assert makespan(gpu, [0.0] * 3, 2, turns) == pytest.approx(6.0)


def test_engines_side_by_side_fall_into_step_and_in_turns_they_do_not():
    """Four files of 1 s on the GPU and 0.6 s on the host, two engines. Side by side the
    two files share the GPU and end it together at 2 s, then both are on the host
    (the GPU idle) until 2.6 s; twice: 5.2 s. In turns the GPU runs the files one after
    another from 0 to 4 s while the engines alternate on the host: 4.6 s."""
    gpu, host = [1.0] * 4, [0.6] * 4
    assert makespan(gpu, host, 2, turns=False) == pytest.approx(5.2)
    assert makespan(gpu, host, 2, turns=True) == pytest.approx(4.6)
