import json
import re

import jax
import pytest

import aoizora_lab as az
from aoizora_lab.candidates import Candidate
from aoizora_lab.compile import (
    compile_candidates,
    compile_workers,
    kept,
    merge_cache,
    read_entry,
)

TINY = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=4, text_dim=32, text_len=8,
                    freq_dim=32)
WORKLOAD = az.Workload(model=TINY, height=32, width=48, frames=5, text_len=8)
NAMES = ["cfg2-uly4", "cfg2-ring4-fsdp", "uly2-ring2-tp2"]


@pytest.fixture()
def host():
    return az.Topology.simulated((2, 4), devices=jax.devices()[:8])


def _candidates():
    return [Candidate.from_name(n, attention="blockwise") for n in NAMES]


@pytest.mark.slow
def test_a_crash_is_recorded_the_rest_finish_and_a_rerun_hits_the_cache(host, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("AOIZORA_LAB_ABORT_CANDIDATE", "cfg2-ring4-fsdp")
    first = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path)
    status = {r.candidate.name: r for r in first}
    assert status["cfg2-ring4-fsdp"].status == "crash"
    assert "SIGABRT" in status["cfg2-ring4-fsdp"].message
    for name in ("cfg2-uly4", "uly2-ring2-tp2"):
        done = status[name]
        assert done.status == "ok" and not done.cached
        assert done.memory["peak"] > 0 and done.compile_seconds > 0
        assert done.program.total_bytes > 0 and "HloModule" in done.hlo_text
    monkeypatch.delenv("AOIZORA_LAB_ABORT_CANDIDATE")
    second = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path)
    cached = {r.candidate.name: r.cached for r in second}
    assert cached == {"cfg2-uly4": True, "cfg2-ring4-fsdp": False, "uly2-ring2-tp2": True}
    third = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path)
    assert all(r.cached and r.status == "ok" for r in third)
    for a, b in zip(first, third, strict=True):
        if a.status == "ok":
            assert a.program == b.program


@pytest.mark.slow
def test_a_corrupted_cache_entry_is_recompiled(host, tmp_path):
    [first] = compile_candidates(_candidates()[:1], WORKLOAD, host, cache_dir=tmp_path)
    first.hlo_path.write_text(first.hlo_text[: len(first.hlo_text) // 2])  # truncated
    assert read_entry(first.hlo_path.parent) is None  # detected and removed
    [again] = compile_candidates(_candidates()[:1], WORKLOAD, host, cache_dir=tmp_path)
    assert again.status == "ok" and not again.cached and again.program == first.program


@pytest.mark.slow
def test_merged_entries_are_cache_hits_in_the_target(host, tmp_path):
    source, target = tmp_path / "cold", tmp_path / "kept"
    [first] = compile_candidates(_candidates()[:1], WORKLOAD, host, cache_dir=source)
    (source / "ir").mkdir()  # what else a cache root holds is not an entry
    assert merge_cache(source, target) == 1
    assert merge_cache(source, target) == 0  # what the target has is left alone
    [again] = compile_candidates(_candidates()[:1], WORKLOAD, host, cache_dir=target)
    assert again.cached and again.program == first.program
    assert again.compile_seconds == first.compile_seconds  # the compile's own time, kept


@pytest.mark.slow
def test_each_compile_says_how_long_the_sweep_has_left(host, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AOIZORA_LAB_PROGRESS", "1")
    seen = []

    def describe(result):  # the planner's hook: its text ends the result's line
        seen.append(result)
        return f"seen {len(seen)}"

    results = compile_candidates(_candidates()[:2], WORKLOAD, host, cache_dir=tmp_path,
                                 describe=describe)
    lines = [line for line in capsys.readouterr().err.splitlines() if "compile " in line]
    assert len(lines) == 2
    assert re.search(r"compile 1 of 2 .* ok in \d+ s; about \d+ s left; seen 1$",
                     lines[0]), lines
    assert lines[1].endswith(" s; seen 2") and "left" not in lines[1]  # nothing left
    assert sorted(r.candidate.name for r in seen) == sorted(r.candidate.name for r in results)
    assert all(r.program is not None for r in seen)  # parsed as it arrived
    compile_candidates(_candidates()[:2], WORKLOAD, host, cache_dir=tmp_path)
    assert "compile " not in capsys.readouterr().err  # cached: nothing worth a line

    # Under a time limit the estimate never promises more than the time left to it.
    from aoizora_lab.compile import DEFAULT_FLAGS, CompileQueue

    for left, shown in ((0.0, r"about 0 s left \(time limit\)"),
                        (1e9, r"about [\d.]+ (s|min) left$")):
        with CompileQueue(WORKLOAD, host, cache_dir=tmp_path / str(left), expected=3,
                          time_left=lambda left=left: left) as queue:
            queue.compile(_candidates()[0], DEFAULT_FLAGS)
        [line] = [x for x in capsys.readouterr().err.splitlines() if "compile 1 of 3" in x]
        assert re.search(shown, line), line

    def broken(result):
        raise RuntimeError("boom")

    again = compile_candidates(_candidates()[:2], WORKLOAD, host, cache_dir=tmp_path,
                               describe=broken)  # a progress hook that fails ends nothing
    assert [(r.candidate.name, r.status) for r in again] == [
        (r.candidate.name, r.status) for r in results]


def test_a_hang_past_the_timeout_is_recorded(host, tmp_path, monkeypatch):
    candidate = _candidates()[0]
    monkeypatch.setenv("AOIZORA_LAB_HANG_CANDIDATE", candidate.name)  # a real hang
    cache = tmp_path / "cache"
    [result] = compile_candidates([candidate], WORKLOAD, host, cache_dir=cache, timeout_s=3)
    assert result.status == "timeout" and "3 s" in result.message
    # nothing cached (a "." folder is a staging area): the next sweep retries it
    assert not [e for e in cache.glob("*") if not e.name.startswith(".")]


@pytest.mark.slow
def test_folded_layers_give_the_full_depth_program(host, tmp_path):
    for candidate in _candidates():
        [full] = compile_candidates([candidate], WORKLOAD, host, cache_dir=tmp_path)
        [folded] = compile_candidates([candidate], WORKLOAD, host, cache_dir=tmp_path,
                                      num_layers=2)
        assert folded.compiled_layers == 2 and full.compiled_layers == 4
        key = ["kind", "bytes", "count", "group_size", "num_groups", "loop_depth"]
        full_rows = sorted(map(tuple, full.program.to_frame()[key].to_numpy()))
        folded_rows = sorted(map(tuple, folded.program.to_frame()[key].to_numpy()))
        assert folded_rows == full_rows, candidate.name
        assert folded.program.total_bytes == full.program.total_bytes
        # Compute in the layer loop scales too (the ops outside it are the same in both).
        assert folded.program.flops == pytest.approx(full.program.flops, rel=1e-9)


@pytest.mark.slow
def test_a_program_that_cannot_be_folded_is_recorded_and_the_sweep_goes_on(host, tmp_path):
    # One layer of four: XLA drops a loop of one trip, so there is no layer loop to scale.
    results = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path,
                                 num_layers=1)
    assert [r.candidate.name for r in results] == NAMES
    for result in results:
        assert result.status == "error" and result.program is None
        assert result.candidate.name in result.message and "cannot be folded" in result.message


def test_simulated_slices_and_bad_depths_are_refused(tmp_path):
    with pytest.raises(az.AoizoraError, match="nothing compiles"):
        compile_candidates(_candidates(), WORKLOAD, az.Topology.simulated((2, 4)),
                           cache_dir=tmp_path)
    host = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    with pytest.raises(az.AoizoraError, match="num_layers=9"):
        compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path, num_layers=9)


@pytest.mark.parametrize(("result", "keep"), [
    ({"status": "ok"}, True),
    ({"status": "oom", "message": "XlaRuntimeError: RESOURCE_EXHAUSTED: ..."}, True),
    ({"status": "error", "message": "JaxRuntimeError: UNIMPLEMENTED: Async all-to-all not "
                                    "supported on limited ICI"}, True),
    ({"status": "error", "message": "JaxRuntimeError: INVALID_ARGUMENT: No such compile "
                                    "option: 'xla_tpu_bogus_flag'"}, True),
    # The machine's, or not sure: retried.
    ({"status": "error", "message": "JaxRuntimeError: INTERNAL: RET_CHECK failure"}, False),
    ({"status": "error", "message": "MemoryError: "}, False),
    ({"status": "error", "message": "OSError: [Errno 28] No space left on device"}, False),
    ({"status": "error", "message": "...orted on limited ICI (UNIMPLEMENTED: cut at the start)"},
     False),
    ({"status": "crash", "message": "JaxRuntimeError: UNIMPLEMENTED: after a SIGABRT"}, False),
    ({"status": "timeout", "message": "no result after 600 s"}, False),
])
def test_the_cache_keeps_deterministic_verdicts_only(result, keep):
    assert kept(result) is keep


@pytest.mark.slow
def test_the_compilers_refusal_is_cached_so_a_warm_plan_does_not_compile_it_again(tmp_path):
    # v5e's ICI refuses asynchronous all-to-alls over a 4x8 slice's long lines (as it refuses
    # MaxDiffusion's Ulysses flags on the Wan cases): the same answer every time.
    topology = az.Topology.from_name("v5e:4x8", deviceless=True)
    candidate = Candidate.from_name("uly8-ctx4", attention="blockwise")
    flags = "--xla_tpu_enable_async_all_to_all=true"
    [first] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=tmp_path,
                                 flags=flags)
    assert first.status == "error" and "UNIMPLEMENTED" in first.message and not first.cached
    [again] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=tmp_path,
                                 flags=flags)
    assert again.cached and (again.status, again.message) == (first.status, first.message)


@pytest.mark.slow
def test_an_out_of_hbm_candidate_is_recorded_as_oom(tmp_path):
    # 14B with weights replicated (no fsdp, no tp) needs 28.6 GB per 16 GB v5e chip.
    topology = az.Topology.from_name("v5e:2x2", deviceless=True)
    workload = az.Workload.preset("wan2.1-t2v-14b", "480p")
    [result] = compile_candidates([Candidate.from_name("cfg2-uly2")], workload, topology,
                                  cache_dir=tmp_path)
    assert result.status == "oom", result.message[:500]
    assert "RESOURCE_EXHAUSTED" in result.message


@pytest.mark.slow
def test_a_dask_cluster_executor_runs_the_sweep(host, tmp_path):
    import distributed
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        results = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path,
                                     executor=client.get_executor())
    assert [r.status for r in results] == ["ok", "ok", "ok"]
    again = compile_candidates(_candidates(), WORKLOAD, host, cache_dir=tmp_path)
    assert all(r.cached for r in again)  # the workers wrote the shared cache


@pytest.mark.slow
def test_compiler_flags_reach_the_compiler_and_key_the_cache(tmp_path, monkeypatch):
    topology = az.Topology.from_name("v5e:2x2", deviceless=True)
    candidate = Candidate.from_name("uly4", attention="blockwise")
    # The environment's own flags never leak into a compile (the cache key lists them all).
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_bogus_env_flag=true")
    [plain] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=tmp_path)
    [tuned] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=tmp_path,
                                 flags="maxdiffusion-ulysses")
    [bogus] = compile_candidates([candidate], WORKLOAD, topology, cache_dir=tmp_path,
                                 flags="--xla_tpu_bogus_flag=true")
    assert plain.status == tuned.status == "ok", (plain.message, tuned.message)
    assert bogus.status == "error" and "xla_tpu_bogus_flag" in bogus.message
    assert (plain.flags.label, tuned.flags.label) == ("default", "maxdiffusion-ulysses")
    assert plain.hlo_path.parent != tuned.hlo_path.parent  # one cache entry per flag set
    # --xla_tpu_enable_async_all_to_all: the compiler starts the all-to-alls asynchronously;
    # they are read as the same transfers, now asynchronous.
    assert "all-to-all-start(" not in plain.hlo_text
    assert "all-to-all-start(" in tuned.hlo_text

    def all_to_alls(result):
        return sorted((c.bytes, c.count, site.asynchronous) for c, site in
                      zip(result.program.collectives, result.program.sites, strict=True)
                      if c.kind == "all-to-all")

    assert [(b, n) for b, n, _ in all_to_alls(plain)] == [
        (b, n) for b, n, _ in all_to_alls(tuned)]
    assert not any(a for *_, a in all_to_alls(plain))
    assert any(a for *_, a in all_to_alls(tuned))


def test_flags_are_checked_before_anything_compiles():
    from aoizora_lab.compile import FLAG_SETS, compiler_flags

    assert compiler_flags(None) is FLAG_SETS["default"]
    assert compiler_flags(FLAG_SETS["maxdiffusion-wan"].args) is FLAG_SETS["maxdiffusion-wan"]
    custom = compiler_flags(" --xla_a=true   --xla_b=1 ")
    assert custom.name == "custom" and custom.options == {"xla_a": "true", "xla_b": "1"}
    with pytest.raises(az.AoizoraError, match=r"'xla_a=true' .* is not '--name=value'"):
        compiler_flags("--xla_b=1 xla_a=true")
    with pytest.raises(az.AoizoraError, match="'fast'"):
        compiler_flags("fast")


def test_flag_sets_say_which_collectives_they_make_asynchronous():
    import jax as _jax

    from aoizora_lab.compile import FLAG_SETS, compiler_flags
    from aoizora_lab.ir_estimate import LIBTPU_DEFAULTS
    from aoizora_lab.options import PlanOptions

    assert FLAG_SETS["maxdiffusion-ulysses"].async_kinds == {"all-to-all"}
    assert FLAG_SETS["maxdiffusion-wan"].async_kinds == FLAG_SETS["default"].async_kinds == set()
    flag = "--xla_tpu_enable_async_all_to_all"
    assert compiler_flags(f"{flag}=1").async_kinds == {"all-to-all"}
    assert compiler_flags(f"{flag}=True").async_kinds == {"all-to-all"}
    assert compiler_flags(f"{flag}=true {flag}=false").async_kinds == set()  # the last wins
    # The planner prunes with each searched set's kinds on a TPU slice, libtpu's on host
    # devices (which compile no TPU flags, whichever set comes first).
    options = PlanOptions(flags=("maxdiffusion-ulysses", "default"))
    tpu = az.Topology.from_name("v5e:2x4")
    assert options.flag_async(tpu) == (frozenset({"all-to-all"}), frozenset())
    host = az.Topology.simulated((2, 2), devices=_jax.devices()[:4])
    assert options.flags_on(host) == options.flags[:1]
    assert options.flag_async(host) == LIBTPU_DEFAULTS


def test_compile_workers_fit_the_free_memory():
    gib = 2**30
    assert compile_workers(float("nan"), 20 * gib, 2) == 2  # never measured: one per CPU
    assert compile_workers(4 * gib, 20 * gib, 2) == 2
    assert compile_workers(12 * gib, 20 * gib, 2) == 1
    with pytest.raises(az.AoizoraError, match=r"took 30\.0 GiB .* 20\.0 GiB is free"):
        compile_workers(30 * gib, 20 * gib, 2, what="14B on v5e:16x16")


def test_a_sweep_records_its_memory_and_one_that_cannot_fit_stops_before_compiling(
        host, tmp_path, monkeypatch):
    [done] = compile_candidates(_candidates()[:1], WORKLOAD, host, cache_dir=tmp_path)
    assert done.status == "ok" and done.host_peak_bytes > 2**20  # a Python process at least
    import aoizora_lab.compile as compile_module

    record = json.loads((tmp_path / compile_module.HOST_MEMORY_FILE).read_text())
    assert list(record.values()) == [done.host_peak_bytes]
    monkeypatch.setattr(compile_module, "available_memory", lambda: done.host_peak_bytes / 2)
    entries = set(tmp_path.iterdir())
    with pytest.raises(az.AoizoraError, match="would not fit"):
        compile_candidates(_candidates()[1:2], WORKLOAD, host, cache_dir=tmp_path)
    assert set(tmp_path.iterdir()) == entries  # nothing compiled


@pytest.mark.slow
def test_an_edit_that_leaves_the_program_unchanged_reuses_the_compile(host, tmp_path,
                                                                      monkeypatch):
    from aoizora_lab import compile as compile_module

    first = compile_candidates(_candidates()[:2], WORKLOAD, host, cache_dir=tmp_path)
    edited = compile_module.code_versions("aoizora_lab.compile_worker") | {"code": "edited@0"}
    monkeypatch.setattr(compile_module, "code_versions", lambda module: edited)
    # A compile would abort: the second run must answer from the index without compiling.
    monkeypatch.setenv("AOIZORA_LAB_ABORT_CANDIDATE", "cfg2-uly4")
    second = compile_candidates(_candidates()[:2], WORKLOAD, host, cache_dir=tmp_path)
    for a, b in zip(first, second, strict=True):
        assert b.status == "ok" and b.cached and b.program == a.program
        assert b.hlo_path != a.hlo_path  # an entry under the new key
        assert b.compile_seconds == a.compile_seconds  # the compile it reuses
    index = list((tmp_path / compile_module.PROGRAMS).iterdir())
    assert len(index) == 2  # one program each, whichever key found it
    # A different program (another candidate) is not found in the index: it compiles.
    monkeypatch.delenv("AOIZORA_LAB_ABORT_CANDIDATE")
    [third] = compile_candidates(_candidates()[2:], WORKLOAD, host, cache_dir=tmp_path)
    assert third.status == "ok" and not third.cached
