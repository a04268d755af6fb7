"""`device_array`: the (pointer, elements) that `pyspk.cuda.buffer_interface` checks a
buffer for, in the argument order the buffer tests use."""

from __future__ import annotations

from pyspk.cuda.buffers import buffer_interface


def device_array(
    obj: object, expected_len: int, context: str, buffer: str, ordinal: int, **options: bool
) -> tuple[int, int]:
    ptr, count, _ = buffer_interface(
        obj, context, buffer, ordinal, expected_len=expected_len, **options
    )
    return ptr, count
