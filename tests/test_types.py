"""The type registry: unique, collision-free ids, and the C header generated from the one table."""
import gguf
import pytest

from gguftool import types
from gguftool.errors import GgufToolError


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


def test_generated_header_is_current():
    assert types.HEADER_PATH.read_text() == types.render_c_header(), \
        "gguftool/_fast/gqt_types.h is stale: run `python -m gguftool.types --write-header`"


def test_every_table_type_has_its_codec_and_one_only():
    from gguftool.quant import codec, register
    for t in types.CUSTOM_TYPES:
        assert codec(t.name).type is t, t.name   # its family module registered the table's record
    with pytest.raises(ValueError, match="already registered"):
        register(types.CUSTOM_TYPES[0], None, None)


def test_ids_the_reader_cannot_read_are_named():
    assert types.tensor_type(types.CUSTOM_TYPES[0].id) is types.CUSTOM_TYPES[0]
    assert types.tensor_type(int(gguf.GGMLQuantizationType.Q4_1)) == types.stock("Q4_1")
    free = next(i for i in types.GGUFTOOL_ID_RANGE if i not in types.BY_ID)
    for type_id, words in ((free, "newer gguftool"), (999, "fork's private type")):
        with pytest.raises(GgufToolError, match=words):
            types.tensor_type(type_id)
