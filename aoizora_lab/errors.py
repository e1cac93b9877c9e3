"""The library's own error type.

Every check of user input raises :class:`AoizoraError` with a message that quotes the bad value,
lists what is accepted and says how to fix it, so that a notebook user never has to read a
traceback from deep inside jax or numpy to learn what they typed wrong.
"""

import numbers


class AoizoraError(ValueError):
    """Bad input to AoiZora Lab: the message names the value, the accepted ones and the fix."""


def is_whole(value: object, minimum: int = 1, maximum: int | None = None) -> bool:
    """Whether ``value`` is a whole number (Python's or numpy's, never a bool) in range.

    ``is_whole(4)``, ``is_whole(np.int64(4))`` and ``is_whole(0, minimum=0)`` hold;
    ``is_whole(True)``, ``is_whole(4.0)``, ``is_whole("4")`` and ``is_whole(0)`` do not: the
    one test behind every count a user passes (chips, layers, frames, budgets, repeats).
    """
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and value >= minimum and (maximum is None or value <= maximum))
