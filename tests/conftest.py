"""Shared test fixtures.

``shared_data``: the real traces in ``../shared/data`` (relative to the project
root). A fresh clone has no ``../shared``, so tests that need it skip with a
message saying where the data was looked for; the slices in ``data/`` cover
what must always run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real-trace folder, or a skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            f"real traces not found at {SHARED_DATA} (../shared/data from the project root)"
        )
    return SHARED_DATA
