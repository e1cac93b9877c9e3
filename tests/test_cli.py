import inspect
import re
import subprocess
import sys

import pytest

import aoizora_lab as az
from aoizora_lab.cli import main


def test_topology_command_prints_the_slice_and_a_placement_table(capsys):
    assert main(["topology", "v5e:2x4", "--deviceless", "never", "--bytes", "1e7"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("v5e:2x4: 8 chips, 8 devices")
    assert "simulated" in out
    names = ["all-gather over x", "all-gather over y", "all-reduce over all",
             "all-to-all over all", "shift +1 along x"]
    rows = {name: line for line in out.splitlines() for name in names
            if line.strip().startswith(name)}
    assert set(rows) == set(names)
    # Times are the only decimals on a row: compact us, scattered us, slowest / fastest.
    compact_us, scattered_us, ratio = map(float, re.findall(r"\d+\.\d+", rows[names[-1]]))
    assert compact_us <= scattered_us
    assert ratio == pytest.approx(scattered_us / compact_us, abs=0.02)


def test_topology_command_uses_libtpu_devices_when_it_can(capsys):
    assert main(["topology", "v5e:2x2", "--deviceless", "require"]) == 0
    assert "libtpu deviceless" in capsys.readouterr().out


def test_bad_slice_name_is_one_clear_line_and_status_2(capsys):
    assert main(["topology", "v5e:3x3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("aoizora-lab: error:") and "'3x3'" in err and "4x4" in err
    assert "Traceback" not in err


def test_console_script_is_installed():
    done = subprocess.run([sys.executable, "-m", "aoizora_lab.cli", "topology", "v6e:4x4",
                           "--deviceless", "never"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("v6e:4x4: 16 chips")
    assert "WARNING" not in done.stderr


def test_public_api_has_the_documented_signatures():
    for name in ("Topology", "ChipSpec", "chip_spec", "Collective", "CommEstimate", "estimate"):
        assert hasattr(az, name), name
    assert list(inspect.signature(az.estimate).parameters)[:3] == [
        "collectives", "topology", "placement"]
    assert list(inspect.signature(az.Collective).parameters) == [
        "kind", "groups", "bytes", "count", "name"]
    assert inspect.signature(az.Topology.simulated).parameters["generation"].default == "v5e"


@pytest.mark.slow  # traces every valid candidate
def test_prune_command_lists_candidates_and_what_was_kept(capsys):
    from aoizora_lab.candidates import explain_candidates
    from aoizora_lab.cases import parse_case

    case = parse_case("wan2.1-t2v-1.3b@480p/v5e:2x4")
    space = explain_candidates(case.workload, case.topology())
    valid = len(space.valid)
    assert main(["prune", "wan2.1-t2v-1.3b@480p/v5e:2x4", "--show-invalid"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wan2.1-t2v-1.3b@832x480x81 (32,760 tokens) on v5e:2x4: "
                          f"{len(space)} combinations considered, {valid} valid")
    assert "12 heads not divisible by ulysses x tp = 8" in out  # an excluded combination
    kept = re.search(rf"kept (\d+) of {valid} for compilation", out)
    tied = out.count("but tied with the last")  # the budget keeps a tie whole
    assert kept and 3 <= int(kept.group(1)) <= max(3, valid // 4) + tied
    assert main(["prune", "wan2.1-t2v-1.3b@1080p/v5e:2x4"]) == 2
    assert "'1080p'" in capsys.readouterr().err


def test_topology_command_prices_with_the_order_model_asked(capsys):
    # The compact order of a 2x4 slice is a row-major chain over all 8 chips: under the
    # compiler model its all-reduce runs along that chain; without orders it does not.
    rows = {}
    for model in ("compiler", "physical"):
        assert main(["topology", "v5e:2x4", "--deviceless", "never", "--bytes", "1e7",
                     "--order-model", model]) == 0
        out = capsys.readouterr().out
        assert f"device order model '{model}'" in out
        line = next(x for x in out.splitlines() if x.strip().startswith("all-reduce over all"))
        rows[model] = float(re.findall(r"\d+\.\d+", line)[0])
    assert rows["compiler"] > rows["physical"]
    with pytest.raises(SystemExit):
        main(["topology", "v5e:2x4", "--order-model", "ring"])
