"""Numbers for people: byte counts and durations with a unit that fits their size.

Figures label bytes in decimal SI units, as the hardware tables quote link bandwidth
(``45e9`` B/s is "45 GB/s"), and pick one time unit per axis from its largest value, so that a
chart of 3 ms and 40 µs collectives reads ``3.00`` and ``0.04`` ms rather than mixing units.
"""

from __future__ import annotations

_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(count: float) -> str:
    """``25.2e6`` -> ``"25.2 MB"``: three significant digits, decimal units, sign kept."""
    size = abs(float(count))
    step = 0
    while size >= 999.5 and step < len(_BYTE_UNITS) - 1:
        size /= 1000.0
        step += 1
    sign = "-" if count < 0 else ""
    digits = f"{size:.0f}" if step == 0 else f"{size:.3g}"
    return f"{sign}{digits} {_BYTE_UNITS[step]}"


def time_scale(largest_seconds: float) -> tuple[float, str]:
    """(factor, unit) to show durations up to ``largest_seconds``: s, ms or µs.

    Example: ``time_scale(3e-3)`` -> ``(1e3, "ms")``; multiply seconds by the factor.
    """
    if largest_seconds >= 1.0:
        return 1.0, "s"
    if largest_seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def format_seconds(seconds: float) -> str:
    """``5.92e-4`` -> ``"592 µs"``: the unit :func:`time_scale` picks, three digits."""
    factor, unit = time_scale(abs(seconds))
    return f"{seconds * factor:.3g} {unit}"
