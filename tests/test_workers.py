import json
import math
import os

import pytest

from aoizora_lab import workers
from aoizora_lab.errors import AoizoraError
from aoizora_lab.workers import run_in_workers, warm_in_workers


def test_results_come_back_in_call_order_from_several_processes():
    calls = [(2.0, float(i)) for i in range(7)]
    assert run_in_workers(math.pow, calls, workers=3) == [2.0**i for i in range(7)]
    assert os.getpid() not in run_in_workers(os.getpid, [()] * 4, workers=2)  # elsewhere
    assert run_in_workers(os.getpid, [()], workers=2) == [os.getpid()]  # one call: here


def test_a_call_that_raises_raises_here():
    with pytest.raises(ValueError, match="math domain error"):
        run_in_workers(math.sqrt, [(4.0,), (-1.0,), (9.0,)], workers=2)


def test_a_worker_that_dies_is_named_with_its_exit_status():
    with pytest.raises(AoizoraError, match="exit status 3"):
        run_in_workers(os._exit, [(3,), (3,)], workers=2)


def test_what_a_call_prints_does_not_spoil_the_results():
    # print's output would come before the pickled results were it not sent to stderr
    assert run_in_workers(print, [("hello",), ("world",)], workers=2) == [None, None]


def test_warming_notes_a_failure_and_leaves_it_to_the_caller(monkeypatch, capsys):
    monkeypatch.setenv("AOIZORA_LAB_PROGRESS", "1")
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    warm_in_workers(math.sqrt, [(4.0,), (-1.0,)], what="square roots")  # does not raise
    err = capsys.readouterr().err
    assert "square roots: 2 in 2 processes" in err
    assert "square roots: the worker processes failed (ValueError: math domain error)" in err
    warm_in_workers(math.sqrt, [(4.0,)], what="one root")  # one call: not worth a process
    assert "one root" not in capsys.readouterr().err


def test_pools_fit_the_free_memory():
    gib = 2**30
    assert workers.fitting_workers(float("nan"), 20 * gib, 2) == 2  # never measured
    assert workers.fitting_workers(4 * gib, float("nan"), 3) == 3  # free memory unknown
    assert workers.fitting_workers(4 * gib, 20 * gib, 8) == 5
    assert workers.fitting_workers(12 * gib, 20 * gib, 2) == 1
    assert workers.fitting_workers(30 * gib, 20 * gib, 2) == 0


def test_children_record_their_memory_and_the_next_pool_is_sized_by_it(tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("AOIZORA_LAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(workers, "usable_cpus", lambda: 4)
    assert workers.default_workers(math.pow) == 4  # nothing measured yet: one per CPU
    assert run_in_workers(math.pow, [(2.0, 3.0)] * 2, workers=2) == [8.0, 8.0]

    [(name, peak)] = json.loads((tmp_path / workers.MEMORY_FILE).read_text()).items()
    assert name == "math.pow" and peak > 2**20  # a Python process at least
    monkeypatch.setattr(workers, "available_memory", lambda: 2.5 * peak)
    assert workers.default_workers(math.pow) == 2
    assert workers.default_workers(math.sqrt) == 4  # another function: its own record
    monkeypatch.setattr(workers, "available_memory", lambda: 0.5 * peak)
    assert workers.default_workers(math.pow) == 1
    monkeypatch.setenv("AOIZORA_LAB_PROGRESS", "1")
    warm_in_workers(math.pow, [(2.0, 1.0)] * 3, what="powers")  # one fits: no processes
    assert "powers" not in capsys.readouterr().err
