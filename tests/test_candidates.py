import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import aoizora_lab as az
from aoizora_lab.candidates import Candidate, enumerate_candidates, explain_candidates
from aoizora_lab.models.parallel import ROLES
from aoizora_lab.models.wan import init_params, param_specs


@pytest.fixture(scope="module")
def big():
    workload = az.Workload.preset("wan2.1-t2v-14b", "720p")
    topology = az.Topology.from_name("v5e:4x4", deviceless=False)
    return workload, topology, explain_candidates(workload, topology).to_frame()


def test_14b_720p_on_16_chips_lists_the_expected_candidates(big):
    workload, topology, table = big
    valid = set(table[table["valid"]]["name"])
    for name in ("cfg2-uly8-fsdp", "cfg2-ring8-fsdp", "cfg2-ctx8-fsdp", "cfg2-uly4-ring2-fsdp",
                 "cfg2-uly2-ring4-fsdp", "cfg2-tp8", "ring16-fsdp", "uly8-ring2-fsdp"):
        assert name in valid, name
    reasons = dict(zip(table["name"], table["reason"], strict=True))
    assert "40 heads not divisible by ulysses x tp = 16" in reasons["uly16-fsdp"]
    assert "cfg degree 4 > 2 passes" in reasons["cfg4-uly4-fsdp"]
    assert "usable HBM" in reasons["cfg2-uly8"]  # 28.6 GB of weights replicated
    assert "heads not divisible" in reasons["tp16"] and "fsdp needs" in reasons["tp16-fsdp"]
    assert [c.name for c in enumerate_candidates(workload, topology)] == \
        list(table[table["valid"]]["name"])


def test_the_typed_options_agree_with_their_frame(big):
    workload, topology, table = big
    space = explain_candidates(workload, topology)
    assert [o.name for o in space] == list(table["name"])
    assert [o.valid for o in space] == list(table["valid"])
    for option in space:
        if option.candidate is not None:  # the candidate carries the option's degrees
            assert all(option.candidate.degree(r) == d for r, d in option.degrees)
            assert option.candidate.fsdp == option.fsdp
        else:
            assert any(r.startswith("fsdp needs") for r in option.reasons)
    assert [c.name for c in space.valid] == [o.name for o in space if o.valid]


def test_every_combination_is_considered_once(big):
    table = big[2]
    divisors = [d for d in range(1, 17) if 16 % d == 0]
    combos = [c for c in itertools.product(divisors, repeat=len(ROLES)) if math.prod(c) == 16]
    with_cfg = [c for c in combos if c[ROLES.index("cfg")] > 1]
    # fsdp off and on; with a cfg axis also fsdp over the sequence axes only (fsdpseq)
    assert len(table) == 2 * len(combos) + len(with_cfg)
    seq = table[~table["fsdp_over_cfg"]]
    assert len(seq) == len(with_cfg) and (seq["cfg"] > 1).all() and seq["fsdp"].all()
    assert seq["name"].str.endswith("-fsdpseq").all()
    assert table["name"].is_unique
    assert set(map(tuple, table[list(ROLES)].to_numpy())) == set(combos)


def test_token_divisibility_and_padding():
    workload = az.Workload.preset("wan2.1-t2v-1.3b", "480p")  # 32,760 tokens: not / 16
    topology = az.Topology.from_name("v5e:4x4", deviceless=False)
    strict = explain_candidates(workload, topology, allow_padding=False).to_frame()
    strict = strict.set_index("name")
    assert not strict.loc["ctx16", "valid"]
    assert "32,760 tokens not divisible by sequence degree 16 (would pad 8)" in \
        strict.loc["ctx16", "reason"]
    assert strict.loc["cfg2-ctx8", "valid"]
    padded = explain_candidates(workload, topology).to_frame().set_index("name")
    assert padded.loc["ctx16", "valid"]  # padding is the default, as Wan and MaxDiffusion pad


def test_host_devices_get_the_blockwise_backend():
    topology = az.Topology.simulated((2, 4), devices=jax.devices()[:8])
    workload = az.Workload.preset("wan2.1-t2v-1.3b", "480p")
    assert {c.attention for c in enumerate_candidates(workload, topology)} == {"blockwise"}


@pytest.mark.parametrize("name", ["cfg2-uly4-ring2-fsdp", "tp8", "single", "cfg2-ctx4-fsdp",
                                  "uly2-ring2-ctx2-tp2", "cfg2-uly4-chunks2-fsdpseq"])
def test_names_round_trip(name):
    assert Candidate.from_name(name).name == name


@pytest.mark.parametrize(("name", "pattern"), [
    ("cfg2-foo4", r"'foo4'"), ("uly4-uly2", r"'uly2'"), ("tp8-fsdp", "besides tp"),
    ("cfg0", r"'cfg': 0.*at least 1"),
    ("cfg2-ring4-chunks2", r"ulysses_chunks=2.*ulysses axis.*e\.g\. 'cfg2-uly4-chunks2'"),
])
def test_bad_names_are_clear(name, pattern):
    with pytest.raises(az.AoizoraError, match=pattern):
        Candidate.from_name(name)


def test_partition_specs_follow_the_roles():
    cfg = az.WanConfig.preset("wan2.1-t2v-1.3b")
    specs = Candidate.from_name("cfg2-uly2-tp2-fsdp").partition_specs(cfg)
    attn = specs["params"]["blocks"]["self_attn"]
    assert attn["q"]["w"] == P(None, ("cfg", "ulysses"), "tp")  # column parallel, FSDP rows
    assert attn["o"]["w"] == P(None, "tp", ("cfg", "ulysses"))  # row parallel
    assert specs["activations"] == P("cfg", ("ulysses",), None)
    assert specs["attention"] == P("cfg", ("ulysses",), "tp", None)


@pytest.mark.parametrize("name", ["cfg2-uly2-tp2-fsdp", "ring8-fsdp", "ctx2-tp4", "cfg2-uly4"])
def test_weight_bytes_per_device_match_real_shards(name):
    cfg = az.WanConfig(dim=64, ffn_dim=128, num_heads=8, num_layers=2, text_dim=32, text_len=8,
                       freq_dim=32)
    candidate = Candidate.from_name(name, attention="blockwise")
    plan = candidate.plan(jax.devices()[:8])
    params = init_params(cfg, jax.random.key(0))
    placed = jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(plan.mesh, s)), params,
                          param_specs(cfg, plan), is_leaf=lambda x: isinstance(x, P))
    first = jax.devices()[0]
    on_first = sum(s.data.nbytes for leaf in jax.tree.leaves(placed)
                   for s in leaf.addressable_shards if s.device == first)
    assert on_first == candidate.weight_bytes_per_device(cfg, jnp.float32)
    total = sum(np.prod(a.shape) * 4 for a in jax.tree.leaves(params))
    assert (on_first < total) == (candidate.fsdp or candidate.degree("tp") > 1)


def test_fsdpseq_shards_weights_over_the_sequence_axes_only():
    workload = az.Workload.preset("wan2.1-t2v-14b", "480p")
    everywhere, sequence = (Candidate.from_name(n) for n in ("cfg2-ctx4-fsdp",
                                                             "cfg2-ctx4-fsdpseq"))
    assert not sequence.fsdp_over_cfg and sequence.fsdp_axes == ("context",)
    assert everywhere.fsdp_axes == ("cfg", "context")
    cfg = workload.config()
    ratio = sequence.weight_bytes_per_device(cfg) / everywhere.weight_bytes_per_device(cfg)
    assert 1.9 < ratio <= 2.0  # half the shards (norms and biases may stay replicated)
    assert sequence.plan().fsdp_axes == ("context",)
    # Without a cfg axis the two are one program, so one name.
    assert Candidate.from_degrees({"context": 8}, fsdp=True, fsdp_over_cfg=False).name == \
        "ctx8-fsdp"
    with pytest.raises(az.AoizoraError, match="needs a cfg axis"):
        Candidate.from_name("ctx8-fsdpseq")


def test_a14b_holds_both_experts_weights():
    topology = az.Topology.from_name("v5e:2x4", deviceless=False)
    one = explain_candidates(az.Workload.parse("wan2.1-t2v-14b@720p"), topology).to_frame()
    two = explain_candidates(az.Workload.parse("wan2.2-t2v-a14b@720p"), topology).to_frame()
    assert az.Workload.parse("wan2.2-t2v-a14b@720p").experts == 2
    usable = az.hardware.chip_spec("v5e").hbm_usable_bytes
    merged = one.merge(two, on="name", suffixes=("_one", "_two"))
    valid = merged[merged["valid_one"]]
    assert np.allclose(valid["weight_gib_per_device_two"], 2 * valid["weight_gib_per_device_one"])
    assert not (merged["valid_two"] & ~merged["valid_one"]).any()
    lost = valid[~valid["valid_two"]]
    assert len(lost) > 0  # e.g. tp2 without fsdp: 14.3 GB of one expert fits, two do not
    assert (lost["weight_gib_per_device_one"] <= usable / 2**30).all()
    assert lost["reason_two"].str.contains("weights (2 experts)", regex=False).all()
    # Swapping one through the host: the same space as one model's.
    swapped = explain_candidates(az.Workload.parse("wan2.2-t2v-a14b@720p-swap"), topology)
    assert swapped.to_frame()[["name", "valid", "weight_gib_per_device"]].equals(
        one[["name", "valid", "weight_gib_per_device"]])
