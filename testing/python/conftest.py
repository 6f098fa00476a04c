"""Fixtures shared by the NVFP4 W4A16 test modules."""

import os

import pytest


@pytest.fixture(scope="session")
def precompiles() -> bool:
    """Whether a test module compiles its GPU tests' kernels up front (``precompile``: one process per
    CPU core, up to 16). Not in a pytest-xdist worker, where every worker would compile every kernel
    of the module in a pool of its own: 15 workers on the H200 machine's 16 cores finished no test of
    the wgmma module in 560 s (2026-12-01), where one process ran its 115 GPU tests in 124 s. Under
    xdist the workers' in-test compiles are the parallelism."""
    return "PYTEST_XDIST_WORKER" not in os.environ
