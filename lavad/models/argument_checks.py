"""Checks of the counts a model or the daemon is built with, so that a wrong one is refused alike.

Here, with the models, so that both the models and the daemon can use them
(the models import nothing of the daemon).
"""

from __future__ import annotations


def require_at_least(minimum: int, /, **counts: int) -> None:
    """Refuse the first of ``counts``, in the order given, that is below ``minimum``.

    The ``ValueError`` names the argument as its keyword here, so a caller
    passes it under the name its own caller knows it by.
    """
    for name, value in counts.items():
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")
