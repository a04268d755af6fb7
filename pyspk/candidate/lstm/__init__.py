"""The lstm area: the recurrence of a bidirectional LSTM layer of hidden size 128
(segmentation-3.0's) on FP16 tensor cores with FP32 sums and state, many sequences a
launch, the weights held in registers across the steps. Needs the sm80 tier."""

from pyspk.candidate.lstm.plan import (
    LSTM_HIDDEN,
    LstmRecurrencePlan,
    pack_recurrent,
    plan_lstm_recurrence,
)

__all__ = ["LSTM_HIDDEN", "LstmRecurrencePlan", "pack_recurrent", "plan_lstm_recurrence"]
