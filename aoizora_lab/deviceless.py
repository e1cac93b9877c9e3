"""Deviceless TPU devices from libtpu, loaded quietly.

``jax.experimental.topologies.get_topology_desc`` gives compile-only TPU devices with their
real physical coordinates on any x86-64 Linux machine where the ``libtpu`` wheel is installed.
On a machine without TPU chips libtpu prints warnings about ``TPU_ACCELERATOR_TYPE`` and worker
hostnames that mean nothing there; :func:`deviceless_devices` keeps them out of the user's way
while it loads libtpu (:func:`libtpu_environment`):

- ``ALLOW_MULTIPLE_LIBTPU_LOAD=1`` so several processes (a compile pool) may load libtpu;
- on a host with no TPU device files, ``TPU_SKIP_MDS_QUERY=1`` and
  ``TPU_WORKER_HOSTNAMES=localhost`` so libtpu does not look for a TPU VM's metadata server;
- the one call that loads libtpu runs with the process's stderr captured; the text is kept in
  :data:`last_load_log` for debugging.

Nothing here is set on a live TPU VM except ``ALLOW_MULTIPLE_LIBTPU_LOAD``; every variable is
only a default, so a user's own setting wins, and each is put back as it was once libtpu has
loaded: importing or using the package leaves the process environment as it found it.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

last_load_log: str = ""
"""What libtpu printed to stderr during the latest :func:`deviceless_devices` load."""


def host_has_tpu() -> bool:
    """Whether this host has TPU device files (``/dev/accel*`` or ``/dev/vfio/*``)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def libtpu_defaults() -> dict[str, str]:
    """The libtpu environment defaults described in the module docstring, for this host."""
    defaults = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    if not host_has_tpu():
        defaults |= {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost"}
    return defaults


@contextlib.contextmanager
def libtpu_environment() -> Iterator[None]:
    """:func:`libtpu_defaults` set where the environment has no value of its own while
    inside (libtpu reads them as it loads), then removed again."""
    added = {k: v for k, v in libtpu_defaults().items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Redirect file descriptor 2 (C++ logging included) into a list holding one string."""
    sink: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


@functools.cache
def deviceless_devices(topology_name: str) -> tuple[Any, ...]:
    """The compile-only TPU devices of ``topology_name`` (e.g. ``"v5e:4x4"``), in libtpu order.

    Raises ``RuntimeError`` (with libtpu's message and what it printed) when libtpu is missing
    or rejects the name; :meth:`aoizora_lab.Topology.from_name` turns that into a simulated
    slice with a note.
    """
    global last_load_log
    with libtpu_environment(), captured_stderr() as log:
        try:
            from jax.experimental import topologies

            devices = tuple(
                topologies.get_topology_desc(platform="tpu", topology_name=topology_name).devices
            )
            error = None
        except Exception as err:  # libtpu missing, or a name it does not offer
            devices, error = (), err
    last_load_log = log[0]
    if error is not None:
        raise RuntimeError(
            f"libtpu could not describe {topology_name!r}: {type(error).__name__}: {error}"
        ) from error
    return devices
