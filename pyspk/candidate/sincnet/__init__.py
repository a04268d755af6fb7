"""The sincnet area: the first stage of segmentation-3.0's SincNet front end (the sinc
filterbank's strided convolution, |y| and MaxPool1d(3, 3)) in one FP32 kernel, many
chunks a launch, the filters held in shared memory. Needs the sm80 tier."""

from pyspk.candidate.sincnet.plan import (
    SINC_FILTERS,
    SINC_TAPS,
    SincFrontPlan,
    plan_sinc_front,
    sinc_pooled,
)

__all__ = ["SINC_FILTERS", "SINC_TAPS", "SincFrontPlan", "plan_sinc_front", "sinc_pooled"]
