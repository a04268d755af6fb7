"""The attributes of a device that the kernel rules read."""

from __future__ import annotations

import attrs

from pyspk.cuda.errors import InvalidArgument
from pyspk.cuda.tier import ComputeCapability

DEFAULT_SHARED_OPTIN_BYTES = 99 * 1024
DEFAULT_L2_BYTES = 4 * 1024 * 1024


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 1:
        raise InvalidArgument(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class DeviceAttributes:
    """Capability, multiprocessors, opt-in shared memory per block, L2 and name."""

    capability: ComputeCapability
    multiprocessors: int = attrs.field(default=1, validator=_positive)
    shared_optin_bytes: int = DEFAULT_SHARED_OPTIN_BYTES
    l2_bytes: int = DEFAULT_L2_BYTES
    name: str = "test device"

    @classmethod
    def query(cls, ordinal: int = 0) -> DeviceAttributes:
        """Read the attributes of device `ordinal` through the driver (imported here, so
        that this module stays importable without one)."""
        from pyspk.cuda import driver

        properties = driver.device_properties(ordinal)
        major, minor = properties.pop("capability")
        return cls(ComputeCapability(major, minor), **properties)
