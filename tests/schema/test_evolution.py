"""One schema-change policy: what kind of change, and whether older files stay readable."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from deltastream.schema.evolution import SchemaChangeKind, classify_schema_change, schema_problem
from deltastream.schema.model import ColumnMappingMode, StructType, parse_schema


def field(
    name: str, type_: Any, nullable: bool = True, physical: str | None = None
) -> dict[str, Any]:
    meta = {"delta.columnMapping.physicalName": physical} if physical else {}
    return {"name": name, "type": type_, "nullable": nullable, "metadata": meta}


def schema(*fields: dict[str, Any]) -> StructType:
    return parse_schema(json.dumps({"type": "struct", "fields": list(fields)}))


BASE = schema(field("a", "integer"), field("b", "string"))


@pytest.mark.parametrize(
    ("new", "mode", "kind", "unreadable"),
    [
        (BASE, ColumnMappingMode.NONE, SchemaChangeKind.NONE, None),
        (
            schema(field("a", "integer"), field("b", "string"), field("c", "long")),
            ColumnMappingMode.NONE,
            SchemaChangeKind.ADDITIVE,
            None,
        ),
        (schema(field("a", "integer")), ColumnMappingMode.NONE, SchemaChangeKind.NON_ADDITIVE,
         "drops column 'b'"),
        # Widening changes what consumers see, but older files read fine (cast on read).
        (schema(field("a", "long"), field("b", "string")), ColumnMappingMode.NONE,
         SchemaChangeKind.NON_ADDITIVE, None),
        (schema(field("a", "short"), field("b", "string")), ColumnMappingMode.NONE,
         SchemaChangeKind.NON_ADDITIVE, "changes the type of column 'a' from integer to short"),
        (schema(field("a", "integer", nullable=False), field("b", "string")),
         ColumnMappingMode.NONE, SchemaChangeKind.NON_ADDITIVE, None),
    ],
)  # fmt: skip
def test_kind_and_readability(
    new: StructType, mode: ColumnMappingMode, kind: SchemaChangeKind, unreadable: str | None
) -> None:
    change = classify_schema_change(BASE, new, mode)
    assert (change.kind, change.unreadable) == (kind, unreadable)
    assert schema_problem(BASE, new, mode) == unreadable


def test_a_rename_under_column_mapping_is_non_additive_but_readable() -> None:
    old = schema(field("a", "integer", physical="col-1"))
    new = schema(field("x", "integer", physical="col-1"))
    change = classify_schema_change(old, new, ColumnMappingMode.NAME)
    assert change.kind is SchemaChangeKind.NON_ADDITIVE
    assert change.description == "renames column 'a' to 'x'"
    assert change.unreadable is None
    # Without column mapping the same names are a drop and an add: unreadable.
    assert classify_schema_change(old, new, ColumnMappingMode.NONE).unreadable == (
        "drops column 'a'"
    )


def test_nested_changes() -> None:
    old = schema(field("s", {"type": "struct", "fields": [field("i", "integer")]}))
    added = schema(
        field("s", {"type": "struct", "fields": [field("i", "integer"), field("j", "string")]})
    )
    assert classify_schema_change(old, added, ColumnMappingMode.NONE).kind is (
        SchemaChangeKind.ADDITIVE
    )
    widened_map = schema(
        field("m", {"type": "map", "keyType": "string", "valueType": "long",
                    "valueContainsNull": True})
    )  # fmt: skip
    narrow_map = schema(
        field("m", {"type": "map", "keyType": "string", "valueType": "integer",
                    "valueContainsNull": True})
    )  # fmt: skip
    assert schema_problem(narrow_map, widened_map, ColumnMappingMode.NONE) is None
    assert schema_problem(widened_map, narrow_map, ColumnMappingMode.NONE) == (
        "changes the type of column 'm.value' from long to integer"
    )


def test_a_schema_nested_hundreds_deep_is_a_clear_error() -> None:
    from deltastream.errors import InvalidTableStateError
    from deltastream.schema.model import parse_schema

    head = '{"type":"struct","fields":[{"name":"a","type":'
    tail = ',"nullable":true,"metadata":{}}]}'
    inner = head * 400 + '"long"' + tail * 400
    with pytest.raises(InvalidTableStateError, match="nested too deeply"):
        parse_schema(inner)
    # Not a matter of the interpreter's recursion limit, which libraries raise (jedi: 3,000).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(InvalidTableStateError, match="more than 100 levels"):
            parse_schema(inner)
    finally:
        sys.setrecursionlimit(limit)
    assert parse_schema(head * 100 + '"long"' + tail * 100).fields[0].name == "a"


def mapped(name: str, type_: Any, physical: str, id_: int) -> dict[str, Any]:
    meta = {"delta.columnMapping.physicalName": physical, "delta.columnMapping.id": id_}
    return {"name": name, "type": type_, "nullable": True, "metadata": meta}


NESTED = {"type": "struct", "fields": [field("i", "integer")]}
UNMAPPED = schema(field("a", "integer"), field("s", NESTED))
NONE, NAME, ID = ColumnMappingMode.NONE, ColumnMappingMode.NAME, ColumnMappingMode.ID


def turned_on_fields(physical: str = "a", nested: str = "i") -> list[dict[str, Any]]:
    """``UNMAPPED``'s fields with column mapping turned on: ids, and these physical names."""
    inner = {"type": "struct", "fields": [mapped("i", "integer", nested, 3)]}
    return [mapped("a", "integer", physical, 1), mapped("s", inner, "s", 2)]


def turned_on(physical: str = "a", nested: str = "i") -> StructType:
    return schema(*turned_on_fields(physical, nested))


@pytest.mark.parametrize("mode", [NAME, ID])
def test_turning_column_mapping_on_with_the_names_as_physical_names_is_no_change(
    mode: ColumnMappingMode,
) -> None:
    """The older schema is unmapped (its files name columns by their names then): compared
    in its own mode, the logical schema is the same and the files read by those names."""
    change = classify_schema_change(UNMAPPED, turned_on(), mode, NONE)
    assert change.kind is SchemaChangeKind.NONE
    assert (change.unreadable, change.splits_reads) == (None, None)


@pytest.mark.parametrize("mode", [NAME, ID])
def test_turning_column_mapping_on_under_other_physical_names_leaves_older_files_unreadable(
    mode: ColumnMappingMode,
) -> None:
    change = classify_schema_change(UNMAPPED, turned_on(physical="col-1"), mode, NONE)
    what = "changes column 'a' from physical name 'a' to physical name 'col-1' in the data files"
    assert (change.kind, change.unreadable, change.splits_reads) == (
        SchemaChangeKind.NON_ADDITIVE, what, what,
    )  # fmt: skip
    nested = classify_schema_change(UNMAPPED, turned_on(nested="col-3"), mode, NONE)
    assert nested.unreadable == (
        "changes column 's.i' from physical name 'i' to physical name 'col-3' in the data files"
    )


def test_a_field_id_change_under_id_mapping_leaves_older_files_unreadable() -> None:
    old = schema(mapped("a", "integer", "a", 1))
    new = schema(mapped("a", "integer", "a", 7))
    assert classify_schema_change(old, new, ID).unreadable == (
        "changes column 'a' from field id 1 to field id 7 in the data files"
    )
    assert classify_schema_change(old, new, NAME).kind is SchemaChangeKind.NONE


@pytest.mark.parametrize("mode", [NAME, ID])
def test_a_rename_or_drop_after_turning_column_mapping_on_splits_reads(
    mode: ColumnMappingMode,
) -> None:
    """A rename is readable (the files know the column by its physical name), but a read of
    both sides with one schema would show the older rows under the new name: Delta on Spark
    refuses such a range, and so does every deltastream reader of one."""
    a, s = turned_on_fields()
    renamed = schema({**a, "name": "x"}, s)
    for change in (
        classify_schema_change(UNMAPPED, renamed, mode, NONE),
        classify_schema_change(turned_on(), renamed, mode),
    ):
        assert change.kind is SchemaChangeKind.NON_ADDITIVE
        assert change.description == "renames column 'a' to 'x'"
        assert change.unreadable is None
        assert change.splits_reads == "renames column 'a' to 'x'"
    dropped = classify_schema_change(turned_on(), schema(s), mode)
    assert dropped.unreadable == dropped.splits_reads == "drops column 'a'"
    added = classify_schema_change(turned_on(), schema(a, s, mapped("b", "long", "c-9", 9)), mode)
    assert (added.kind, added.description, added.splits_reads) == (
        SchemaChangeKind.ADDITIVE, "adds column 'b'", None,
    )  # fmt: skip
