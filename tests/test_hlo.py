# ruff: noqa: E501 (HLO lines are long)
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import aoizora_lab as az
from aoizora_lab.hlo import parse_hlo

# Shaped like the TPU compiler's output (layouts, async pairs, fusions, a scan's while loop).
HLO = """
HloModule jit_step, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%cond_fused (p: s32[]) -> pred[] {
  %p = s32[] parameter(0)
  %constant.7 = s32[] constant(40)
  ROOT %lt = pred[] compare(s32[] %p, s32[] %constant.7), direction=LT
}

%cond (state: (s32[], bf16[4,8])) -> pred[] {
  %state = (s32[], bf16[4,8]) parameter(0)
  %i = s32[] get-tuple-element((s32[], bf16[4,8]) %state), index=0
  ROOT %fusion.c = pred[] fusion(s32[] %i), kind=kLoop, calls=%cond_fused
}

%async_ag (param_0: bf16[1,1536]) -> bf16[8,1536] {
  %param_0 = bf16[1,1536]{1,0:T(2,128)(2,1)} parameter(0)
  ROOT %all-gather.3 = bf16[8,1536]{1,0:T(8,128)(2,1)} all-gather(%param_0), channel_id=3, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}, dimensions={0}
}

%body (state: (s32[], bf16[4,8])) -> (s32[], bf16[4,8]) {
  %state = (s32[], bf16[4,8]) parameter(0)
  %v = bf16[4,8]{1,0:T(4,128)(2,1)S(1)} get-tuple-element((s32[], bf16[4,8]) %state), index=1
  %all-to-all.1 = bf16[4,8]{1,0:T(4,128)(2,1)} all-to-all(%v), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}
  %collective-permute-start = (bf16[4,8]{1,0}, bf16[4,8]{1,0}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%all-to-all.1), channel_id=2, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  %collective-permute-done = bf16[4,8]{1,0} collective-permute-done(%collective-permute-start)
  %w = bf16[1,1536]{1,0} constant({...})
  %fusion.ag = bf16[8,1536]{1,0} fusion(%w), kind=kCustom, calls=%async_ag
  %i = s32[] get-tuple-element((s32[], bf16[4,8]) %state), index=0
  ROOT %out = (s32[], bf16[4,8]) tuple(%i, %collective-permute-done)
}

ENTRY %main (a: f32[16], b: bf16[4,8]) -> f32[16] {
  %a = f32[16]{0} parameter(0)
  %b = bf16[4,8]{1,0} parameter(1)
  %all-reduce.1 = (f32[16]{0}, f32[16]{0}) all-reduce(%a, %a), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %all-gather-start = (f32[2]{0}, f32[16]{0}) all-gather-start(%a), channel_id=5, replica_groups={}, dimensions={0}
  %all-gather-done = f32[16]{0} all-gather-done(%all-gather-start)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,8]) tuple(%zero, %b)
  %while.1 = (s32[], bf16[4,8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[16]{0} get-tuple-element((f32[16]{0}, f32[16]{0}) %all-reduce.1), index=0
}
"""


def test_every_syntax_kind_and_count_is_read():
    program = parse_hlo(HLO)
    by_name = {c.name: c for c in program.collectives}
    assert set(by_name) == {"all-reduce.1", "all-gather-start", "all-to-all.1",
                            "collective-permute-start", "all-gather.3"}
    assert program.num_devices == 8 and program.notes == ()
    ar = by_name["all-reduce.1"]
    assert (ar.kind, ar.groups, ar.bytes, ar.count) == (
        "all-reduce", ((0, 1, 2, 3), (4, 5, 6, 7)), 2 * 16 * 4, 1)
    ag = by_name["all-gather-start"]  # async: the tuple's second element is the result
    assert (ag.groups, ag.bytes) == ((tuple(range(8)),), 16 * 4)
    a2a = by_name["all-to-all.1"]  # iota [4,2]<=[2,4]T(1,0): arange(8).reshape(2,4).T
    assert a2a.groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and a2a.count == 40
    cp = by_name["collective-permute-start"]
    assert cp.groups == ((0, 1), (1, 0), (2, 3), (3, 2)) and cp.bytes == 4 * 8 * 2
    fused = by_name["all-gather.3"]  # inside an async collective fusion in the loop body
    assert fused.groups == (tuple(range(8)),) and fused.count == 40
    assert fused.bytes == 8 * 1536 * 2
    assert program.total_bytes == sum(c.bytes * c.count for c in program.collectives)


@pytest.mark.parametrize(("device_ids", "ids"), [
    ("7,6,5,4,3,2,1,0", np.arange(8)[::-1]),
    ("[2,4]T(1,0)", np.arange(8).reshape(2, 4).T.ravel()),  # the form the compiler prints
])
def test_mesh_groups_honour_device_ids_and_axis_choice(device_ids, ids):
    text = HLO.replace("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}",
                       f"replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=({device_ids}) "
                       "{'axis_0'}")
    fused = {c.name: c for c in parse_hlo(text).collectives}["all-gather.3"]
    grid = ids.reshape(2, 4)
    assert fused.groups == tuple(tuple(int(v) for v in grid[:, j]) for j in range(4))


def test_an_unknown_group_syntax_is_an_error_not_a_guess():
    text = HLO.replace("replica_groups=[4,2]<=[2,4]T(1,0)", "replica_groups=<weird>")
    with pytest.raises(az.AoizoraError, match=r"all-to-all\.1.*<weird>"):
        parse_hlo(text)


def test_a_loop_without_a_trip_count_is_noted():
    text = HLO.replace("%constant.7 = s32[] constant(40)", "%constant.7 = s32[] parameter(1)")
    program = parse_hlo(text)
    assert any("trip count not found" in note for note in program.notes)
    assert {c.name: c.count for c in program.collectives}["all-to-all.1"] == 1


def test_no_entry_is_a_clear_error():
    with pytest.raises(az.AoizoraError, match="ENTRY"):
        parse_hlo("HloModule empty")


def test_a_real_compiled_program_on_host_devices():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))

    def layer(x, w):
        def body(h, w_layer):
            w_full = jax.lax.with_sharding_constraint(w_layer, NamedSharding(mesh, P()))
            return jnp.tanh(h @ w_full), None
        return jax.lax.scan(body, x, w)[0]

    x = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=NamedSharding(mesh, P("a")))
    w = jax.ShapeDtypeStruct((3, 64, 64), jnp.float32,
                             sharding=NamedSharding(mesh, P(None, "b")))
    compiled = jax.jit(layer).lower(x, w).compile()
    program = parse_hlo(compiled.as_text())
    gathers = [c for c in program.collectives if c.kind == "all-gather"]
    assert gathers, "FSDP-style weight gathers appear"
    assert sum(c.count * c.bytes for c in gathers) >= 3 * 64 * 64 * 4  # every layer's weight
    assert all(len(g) == 4 for c in gathers for g in c.groups)  # over axis "b"
