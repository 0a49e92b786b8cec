"""graph_read.read_nodes skips the call to check_resident / check_depth where
their answer is known (issue 24.5, the 200k-node load): the node it reads and
the message it gives must be those of the full check, for any value."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from celeritas_cli.errors import InvalidInput
from celeritas_cli.model.graph_read import check_resident, read_nodes
from celeritas_cli.model.jsonio import MAX_DEPTH

NASTY = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([0, 5, 6, 2**53, -0.0, 5.0, 6.0, True, False]),
                  st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=2))


def _outcome(f):
    try:
        got = f()
    except Exception as exc:  # noqa: BLE001 - (nan, inf: the schema keeps them out) both must raise alike
        return type(exc).__name__, str(exc)
    return "value", type(got), got


@settings(max_examples=500, deadline=None, database=None)
@given(value=NASTY, memory=st.one_of(st.integers(0, 2**60), st.sampled_from([0, 5, 2**53 - 1])))
def test_resident_bytes_read_as_check_resident_says(value, memory):
    node = {"id": "a", "compute_s": 1.0, "memory_bytes": memory, "resident_bytes": value}
    read = _outcome(lambda: read_nodes([node], "g").extra[0]["resident_bytes"])
    assert read == _outcome(lambda: check_resident(value, memory, "g: node 'a'"))


def _deep(levels: int):
    deep: object = 1
    for _ in range(levels):
        deep = {"x": deep} if levels % 2 else [deep]
    return deep


def test_deep_extra_fields_are_still_rejected_and_the_deepest_allowed_kept():
    node = {"id": "a", "compute_s": 1.0, "memory_bytes": 1, "notes": _deep(MAX_DEPTH)}
    assert read_nodes([node], "g").extra[0]["notes"] == _deep(MAX_DEPTH)
    for levels in (MAX_DEPTH + 1, MAX_DEPTH + 2):
        node["notes"] = _deep(levels)
        try:
            read_nodes([node], "g")
        except InvalidInput as exc:
            assert str(exc) == f"g: node 'a' field notes: nested more than {MAX_DEPTH} levels deep"
        else:
            raise AssertionError("a field nested too deeply was read")
