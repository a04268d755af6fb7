"""The arithmetic a plan is asked for."""

from __future__ import annotations

import enum

from pyspk.cuda.errors import InvalidArgument


class CudaMath(enum.Enum):
    """`FP32`: FP32 products and sums (tensor cores only through the FP32-exact 3xTF32
    split). `TF32`: FP32 storage and accumulation with TF32 (or scaled FP16) products."""

    FP32 = "fp32"
    TF32 = "tf32"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str | CudaMath) -> CudaMath:
        """`text` ("fp32", "tf32", any case), or a `CudaMath` as it is."""
        if isinstance(text, CudaMath):
            return text
        wanted = text.strip().lower()
        for math in cls:
            if math.value == wanted:
                return math
        raise InvalidArgument(f"math {text!r} is not one of fp32, tf32")
