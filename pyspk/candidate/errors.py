"""Why a plan cannot be made: the `PlanError` family."""

from __future__ import annotations


class PlanError(Exception):
    """Base of every refusal to plan a boundary."""


class DeviceUnsupported(PlanError):
    """The device or the loaded kernel module cannot run the requested kernel."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class WeightsOutOfContract(PlanError):
    """The weights fall outside what the kernel's numerics contract covers."""

    def __init__(self, context: str, reason: str) -> None:
        self.context = context
        self.reason = reason
        super().__init__(f"{context}: {reason}")


class GeometryError(PlanError):
    """A boundary's shape cannot be planned."""

    def __init__(self, context: str, reason: str) -> None:
        self.context = context
        self.reason = reason
        super().__init__(f"{context}: {reason}")


class GeometryInvalid(GeometryError):
    """A violated invariant: a bug in the caller, never a reason to fall back."""


class GeometryUnimplemented(GeometryError):
    """A valid geometry that this area does not implement; another path may."""
