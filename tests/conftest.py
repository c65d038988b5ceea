"""Shared test fixtures.

``shared_data``: the real traces in ``../shared/data`` (relative to the project
root). A fresh clone has no ``../shared``, so tests that need it skip with a
message saying where the data was looked for; the slices in ``data/`` cover
what must always run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lavad.streams.kafka.embedded import BrokerError, EmbeddedBroker

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


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    """A real Kafka-protocol broker (Tansu, memory storage) on a free loopback port."""
    try:
        handle = EmbeddedBroker.start()
    except BrokerError as exc:
        pytest.fail(f"the embedded broker did not start: {exc}")
    try:
        yield handle
    finally:
        handle.close()
