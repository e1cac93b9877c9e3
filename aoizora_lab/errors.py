"""The library's own error type.

Every check of user input raises :class:`AoizoraError` with a message that quotes the bad value,
lists what is accepted and says how to fix it, so that a notebook user never has to read a
traceback from deep inside jax or numpy to learn what they typed wrong.
"""


class AoizoraError(ValueError):
    """Bad input to AoiZora Lab: the message names the value, the accepted ones and the fix."""
