"""Where an estimate came from, ordered from most to least trustworthy."""

from __future__ import annotations

from enum import IntEnum


class Provenance(IntEnum):
    """`max()` of several provenances is the least trustworthy one."""

    MEASURED = 0
    """This exact shape was measured on this device."""
    CALIBRATED = 1
    """Fitted on this device's measurements, shape inside the fitted range."""
    TRANSFERRED = 2
    """Fitted on other devices and carried over through the datasheet (cross-generation tier)."""
    EXTRAPOLATED = 3
    """Shape outside the range the model was fitted on."""
    ROOFLINE = 4
    """No fitted model: the datasheet roofline bound."""

    def label(self) -> str:
        return self.name.lower()
