"""Test session set-up: CPU jax with 8 host devices, libtpu quiet, no calibration files."""

import os

# Before jax loads: tests run on CPU host devices (deviceless TPU compiles need no TPU backend).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pytest
from hypothesis import settings

# CI runs the same examples every time (a failure there is reproducible, never luck); locally
# Hypothesis explores afresh.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


SAME_PLAN = {"tests/test_measure.py": "tests/test_planner.py"}
"""Files whose module fixtures make the same plan: one worker runs them one after the other,
so the second reads the first's compiles from the session cache instead of compiling them
again at the same time."""


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # without xdist: never called
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``--dist loadfile`` (whole files per worker, so module fixtures run
    once), with the files of :data:`SAME_PLAN` scheduled as one. (``--dist loadgroup`` would
    say it with marks, but it cannot regroup tests under pytest 9.2.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SamePlanScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return SAME_PLAN.get(scope, scope)

    return SamePlanScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def _session_cache(tmp_path_factory):
    """Every compile and IR trace of the session goes to a temporary cache, never the
    user's cache folder (children and notebook kernels inherit the variable). The
    pytest-xdist workers of one run share it (the caches are safe for several processes), so
    what one worker compiled is a hit in the other."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "aoizora-cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("aoizora-cache")
    previous = os.environ.get("AOIZORA_LAB_CACHE_DIR")
    os.environ["AOIZORA_LAB_CACHE_DIR"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("AOIZORA_LAB_CACHE_DIR")
    else:
        os.environ["AOIZORA_LAB_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def _no_user_calibration(tmp_path, monkeypatch):
    """Point calibration at an empty folder so a developer's files never change a result."""
    folder = tmp_path / "calibration"
    folder.mkdir()
    monkeypatch.setenv("AOIZORA_LAB_CALIBRATION_DIR", str(folder))
    return folder
