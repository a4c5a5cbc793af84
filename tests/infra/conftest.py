"""Fixtures for tests against real local services (PostgreSQL, two-node Ray, MLflow server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.services import LocalStack
from tests.infra.services import local_stack as start_local_stack


@pytest.fixture(scope="module")
def local_stack() -> Iterator[LocalStack]:
    """PostgreSQL, a Ray head + one joined node (1 CPU each) and an MLflow server, for one test module.

    Teardown raises `ServiceError` if any process of the stack is still alive after stopping.
    """
    with start_local_stack() as stack:
        yield stack
