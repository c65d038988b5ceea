"""matplotlib for the commands that draw, from the optional ``evaluation`` extra.

The daemon does without it; a command asked to plot on an install without
the extra says what to install instead of failing on an import.
"""

from __future__ import annotations

from typing import Any


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (no screen here)."""
    try:
        import matplotlib  # noqa: PLC0415 - only plotting runs pay for the import
    except ModuleNotFoundError:
        raise PlotsUnavailable(
            "plots need matplotlib: pip install 'lavad[evaluation]' (make installs it)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt
