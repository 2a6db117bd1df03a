"""Reading a data file's variant column: an unshredded one (binary ``metadata`` and
``value``) passes through; a shredded one (Parquet's "VariantShredding" spec: a
``typed_value`` beside an optional residual ``value``) is reassembled into the unshredded
encoding, so readers get the same values whether a writer shredded them or not. A column
that breaks the shredding rules raises :class:`MalformedVariantError`: a doubtful value is
never guessed."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltastream.read.variant.columns import bools, containers, encode_primitives
from deltastream.read.variant.encoding import (
    EMPTY_METADATA,
    VARIANT_NULL,
    AnyArray,
    Dictionary,
    Indexes,
    MalformedVariantError,
    compute,
    encode_object,
    object_fields,
    parse_metadata,
)
from deltastream.schema.model import VARIANT_ARROW_TYPE

__all__ = ["read_variant_column"]

# --- reassembling shredded groups --------------------------------------------------------


def _binary(values: AnyArray, where: str) -> AnyArray:
    t = values.type
    if pa.types.is_binary(t):
        return values
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return values.cast(pa.binary())
    raise MalformedVariantError(f"{where} is {t}, not binary")


def _any(mask: Any) -> bool:
    return bool(pc.any(mask).as_py())


class _Metadata:
    """The distinct metadata blobs of a column, decoded on first use, and which one each
    row of the current nesting level uses."""

    def __init__(self, blobs: AnyArray) -> None:
        self.blobs = blobs
        self._decoded: dict[int, Dictionary] = {}

    def get(self, index: int) -> Dictionary:
        dictionary = self._decoded.get(index)
        if dictionary is None:
            blob = self.blobs[index].as_py()
            dictionary = self._decoded[index] = parse_metadata(blob)
        return dictionary

    def field_ids(self, name: str, rows: Indexes) -> Indexes:
        """The id of field ``name`` in each row's metadata (-1 where it has none)."""
        distinct = np.unique(rows)
        lookup = np.full(len(self.blobs), -1, dtype=np.int64)
        for index in distinct.tolist():
            lookup[index] = self.get(index).ids.get(name, -1)
        return lookup[rows]


def _group(group: AnyArray, where: str) -> tuple[AnyArray | None, AnyArray | None]:
    """The ``value`` and ``typed_value`` of a shredded group, with the group's nulls."""
    if not pa.types.is_struct(group.type):
        raise MalformedVariantError(f"{where} is {group.type}, not a value/typed_value group")
    struct_type: Any = group.type
    names = [struct_type.field(i).name for i in range(struct_type.num_fields)]
    unexpected = sorted(set(names) - {"value", "typed_value"})
    if unexpected:
        raise MalformedVariantError(f"{where} has unexpected fields {unexpected}")
    children = dict(zip(names, cast(pa.StructArray, group).flatten(), strict=True))
    value = children.get("value")
    typed = children.get("typed_value")
    if value is None and typed is None:
        raise MalformedVariantError(f"{where} has neither value nor typed_value")
    return (None if value is None else _binary(value, f"{where}.value")), typed


class _Reassembler:
    """Rebuilds the unshredded ``value`` of a shredded variant column, level by level."""

    def __init__(self, metadata: _Metadata) -> None:
        self.metadata = metadata

    def encode(
        self, value: AnyArray | None, typed: AnyArray | None, rows: Indexes, where: str
    ) -> AnyArray:
        """Each row's encoded value (null: missing) from its ``value``/``typed_value``."""
        if typed is None:
            assert value is not None
            return value
        kind = typed.type
        if pa.types.is_struct(kind):
            return self.object(value, typed, rows, where)
        if value is not None and _any(pc.and_(value.is_valid(), typed.is_valid())):
            raise MalformedVariantError(
                f"{where}: a row has both value and typed_value, which only an object may"
            )
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            encoded = self.array(typed, rows, where)
        else:
            encoded = encode_primitives(typed, f"{where}.typed_value")
        if value is None:
            return encoded
        merged: AnyArray = pc.coalesce(encoded, value)
        return merged

    def array(self, typed: AnyArray, rows: Indexes, where: str) -> AnyArray:
        lists: Any = typed
        lengths = np.asarray(
            pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )
        elements: AnyArray = lists.flatten()
        element_where = f"{where}[]"
        if elements.null_count:
            raise MalformedVariantError(f"{element_where}: an array element group is null")
        value, element_typed = _group(elements, element_where)
        element_rows = np.repeat(rows, lengths)
        encoded = self.encode(value, element_typed, element_rows, element_where)
        if encoded.null_count:
            raise MalformedVariantError(
                f"{element_where}: an array element is missing (neither value nor typed_value)"
            )
        built = containers(lengths, encoded, None)
        present: AnyArray = pc.if_else(typed.is_valid(), built, pa.scalar(None, pa.binary()))
        return present

    def object(
        self, value: AnyArray | None, typed: AnyArray, rows: Indexes, where: str
    ) -> AnyArray:
        n = len(typed)
        struct_type: Any = typed.type
        names = [struct_type.field(i).name for i in range(struct_type.num_fields)]
        children = cast(pa.StructArray, typed).flatten()
        # Shredded fields in name order (UTF-8 byte order is code-point order), each with
        # its encodings (null: the field is missing) and its id in each row's metadata.
        ordered = sorted(zip(names, children, strict=True), key=lambda nc: nc[0])
        field_names = [name for name, _ in ordered]
        encodings: list[AnyArray] = []
        field_ids = np.zeros((n, len(ordered)), dtype=np.int64)
        for j, (name, child) in enumerate(ordered):
            field_where = f"{where}.{name}"
            field_value, field_typed = _group(child, field_where)
            encodings.append(self.encode(field_value, field_typed, rows, field_where))
            field_ids[:, j] = self.metadata.field_ids(name, rows)
        is_object = bools(typed.is_valid())
        has_residual = bools(value.is_valid()) if value is not None else np.zeros(n, dtype=np.bool_)
        present = np.zeros((n, len(ordered)), dtype=np.bool_)
        for j, encoded in enumerate(encodings):
            present[:, j] = bools(encoded.is_valid()) & is_object
        unknown = present & (field_ids < 0)
        if unknown.any():
            name = field_names[int(np.nonzero(unknown)[1][0])]
            raise MalformedVariantError(
                f"{where}: shredded field {name!r} is not in the row's metadata"
            )
        # Not an object: the value as it is (null: missing).
        result: AnyArray = value if value is not None else pa.nulls(n, pa.binary())
        # Objects of shredded fields only: built column-wise.
        whole = is_object & ~has_residual
        if whole.any():
            fields_present = present & whole[:, None]
            row_index, field_index = np.nonzero(fields_present)  # row after row, name order
            flat = pa.concat_arrays(encodings) if encodings else pa.nulls(0, pa.binary())
            elements = flat.take(pa.array(field_index * n + row_index))
            built = containers(
                fields_present.sum(axis=1), elements, field_ids[row_index, field_index]
            )
            mask = pa.array(whole)
            result = compute.replace_with_mask(result, mask, built.filter(mask))
        # Partially shredded objects: merged with their residual object row by row.
        partial = np.nonzero(is_object & has_residual)[0]
        if len(partial):
            result = compute.replace_with_mask(
                result,
                pa.array(is_object & has_residual),
                self.merge(value, encodings, field_names, field_ids, rows, partial, where),
            )
        return result

    def merge(
        self,
        value: AnyArray | None,
        encodings: list[AnyArray],
        names: list[str],
        field_ids: Indexes,
        rows: Indexes,
        partial: Indexes,
        where: str,
    ) -> AnyArray:
        """The partially shredded objects of rows ``partial``: shredded fields and the
        residual object's fields, together in name order."""
        assert value is not None
        residuals = cast(list[bytes], value.take(partial).to_pylist())
        columns = [cast(list[bytes | None], e.take(partial).to_pylist()) for e in encodings]
        out: list[bytes] = []
        for k, i in enumerate(partial.tolist()):
            fields: list[tuple[str, int, bytes]] = []
            for j, name in enumerate(names):
                encoded = columns[j][k]
                if encoded is not None:
                    fields.append((name, int(field_ids[i, j]), encoded))
            dictionary = self.metadata.get(int(rows[i]))
            try:
                extra = object_fields(residuals[k], dictionary)
            except MalformedVariantError as e:
                raise MalformedVariantError(
                    f"{where}: typed_value is an object but value is not one ({e})"
                ) from None
            if extra:
                taken = {name for name, _, _ in fields}
                clash = sorted(taken.intersection(name for name, _, _ in extra))
                if clash:
                    raise MalformedVariantError(
                        f"{where}: field {clash[0]!r} is both shredded and in value"
                    )
                fields = sorted(fields + extra, key=lambda f: f[0])
            out.append(encode_object(fields))
        return pa.array(out, pa.binary())


def read_variant_column(column: AnyArray, name: str = "variant") -> AnyArray:
    """A data file's variant column (a ``metadata``/``value`` group, shredded or not) as
    :data:`~deltastream.schema.model.VARIANT_ARROW_TYPE`. A present variant whose value is
    missing reads as Variant null. Raises :class:`MalformedVariantError`, whose message
    locates the problem from ``name`` (``name.a.b[]``)."""
    if not pa.types.is_struct(column.type):
        raise MalformedVariantError(f"{name} is stored as {column.type}, not a variant group")
    struct = cast(pa.StructArray, column)
    names = [struct.type.field(i).name for i in range(struct.type.num_fields)]
    unexpected = sorted(set(names) - {"metadata", "value", "typed_value"})
    if "metadata" not in names or unexpected or names == ["metadata"]:
        raise MalformedVariantError(
            f"{name} is stored as {column.type}, not a variant group (metadata, value, typed_value)"
        )
    # The children as stored: under a null variant they hold whatever the file has (the
    # Parquet reader gives empty values), so an unshredded column passes through uncopied.
    raw = {n: struct.field(n) for n in names}
    metadata = _binary(raw["metadata"], f"{name}.metadata")
    if metadata.null_count:
        if _any(pc.and_(struct.is_valid(), metadata.is_null())):
            raise MalformedVariantError(f"{name}: a variant has no metadata")
        # Null variants: the field is declared non-null, so give them an empty dictionary.
        metadata = metadata.fill_null(pa.scalar(EMPTY_METADATA, pa.binary()))
    encoded: AnyArray
    if "typed_value" not in raw:
        encoded = _binary(raw["value"], f"{name}.value")
    else:
        # With the variant's nulls: a null variant has neither value nor typed_value.
        children = dict(zip(names, struct.flatten(), strict=True))
        value = _binary(children["value"], f"{name}.value") if "value" in children else None
        # Rows index the distinct metadata blobs: writers repeat one blob in every row, so
        # each is decoded once (and only if an object needs its field names).
        blobs = metadata
        if struct.null_count:
            # Under a null variant the stored metadata may be anything (often empty).
            empty = pa.scalar(EMPTY_METADATA, pa.binary())
            blobs = pc.if_else(struct.is_valid(), metadata, empty)
        distinct: Any = pc.dictionary_encode(blobs)
        rows = np.asarray(distinct.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        reassembler = _Reassembler(_Metadata(distinct.dictionary))
        encoded = reassembler.encode(value, children["typed_value"], rows, name)
    if encoded.null_count:
        # Missing (neither value nor typed_value) where a value is required: Variant null.
        encoded = encoded.fill_null(pa.scalar(VARIANT_NULL, pa.binary()))
    fields = [VARIANT_ARROW_TYPE.field(0), VARIANT_ARROW_TYPE.field(1)]
    mask = struct.is_null() if struct.null_count else None
    result: AnyArray = pa.StructArray.from_arrays([metadata, encoded], fields=fields, mask=mask)
    return result
