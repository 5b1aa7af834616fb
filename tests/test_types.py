"""The type registry: unique, collision-free ids, and the C header generated from the one table."""
import gguf
import pytest

from gguftool import types


def test_ids_collide_with_nothing_known():
    assert types.collisions() == []


def test_collision_check_catches_upstream_and_fork_ids():
    # The check itself must be able to fail: an upstream-style enum holding one of our ids.
    ours = types.CUSTOM_TYPES[0]
    assert types.collisions({"GGML_TYPE_FUTURE": ours.id}) == [f"{ours.name} id {ours.id} collides with GGML_TYPE_FUTURE"]
    for owner, ids in types.FOREIGN_RANGES.items():
        assert not set(ids) & set(types.GGUFTOOL_ID_RANGE), owner


def test_ids_far_from_upstream_growth():
    newest = max(m.value for m in gguf.GGMLQuantizationType)
    for t in types.CUSTOM_TYPES:
        assert t.id - newest >= 400  # over a century of upstream growth at ~3 new types a year


def test_table_matches_design_layouts():
    table = {t.name: (t.block_size, t.type_size, t.bpw) for t in types.CUSTOM_TYPES}
    assert table == {"Q4_HQQ": (32, 20, 5.0), "Q4_HQQ_128": (128, 68, 4.25), "TQ3_0": (32, 14, 3.5)}


def test_generated_header_is_current():
    assert types.HEADER_PATH.read_text() == types.render_c_header(), \
        "gguftool/_fast/gqt_types.h is stale: run `python -m gguftool.types --write-header`"


@pytest.mark.parametrize("t", types.CUSTOM_TYPES, ids=lambda t: t.name)
def test_header_and_enum_lines_carry_every_type(t):
    h = types.render_c_header()
    assert f"#define GQT_TYPE_{t.name} {t.id}\n" in h
    assert f"#define GQT_{t.name}_BYTES {t.type_size}\n" in h
    assert f"GGML_TYPE_{t.name} = {t.id}," in types.render_ggml_enum_lines()
