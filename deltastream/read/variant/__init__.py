"""Variant columns: reading them from data files, and their binary encoding.

This module owns everything deltastream knows about the ``variant`` type (Delta's
``variantType`` and ``variantShredding`` features) below the table schema:

* the Variant binary encoding (Parquet's "VariantEncoding" spec): a value is a ``metadata``
  blob (a dictionary of field names) and a ``value`` blob (a self-describing tree of
  primitives, arrays and objects whose keys are ids into that dictionary);
* reading a variant column of a data file into
  :data:`~deltastream.schema.model.VARIANT_ARROW_TYPE` (:func:`read_variant_column`). An
  unshredded column (a group of binary ``metadata`` and ``value``) is passed through. A
  shredded one (Parquet's "VariantShredding" spec: ``metadata``, an optional binary
  ``value`` and a ``typed_value`` holding part of the value as typed Parquet columns, nested
  as objects and arrays) is reassembled into the unshredded encoding, so a reader sees the
  same values whether a writer shredded them or not;
* turning an encoded variant into JSON text (:func:`variant_to_json`,
  :func:`variant_array_to_json`), for consumers that want text rather than the encoding.

Modules: :mod:`.encoding` (the binary encoding, value by value), :mod:`.columns` (whole
columns encoded at once), :mod:`.shredding` (a data file's column, reassembled),
:mod:`.json_text` (JSON).

Reassembly is vectorised: each shredded column is encoded in one Arrow/numpy pass, and arrays
and objects are assembled column-wise from their children's encodings (with the smallest
field sizes, as a row-by-row encoder would); only partially shredded objects, whose residual
``value`` must be parsed and merged, are built row by row. A file that breaks
the shredding rules (``value`` and ``typed_value`` both set for a non-object, a shredded
field also present in the residual ``value``, an array element missing, an unknown typed
column type, ...) raises :class:`MalformedVariantError`, which the data reader turns into a
:class:`~deltastream.errors.DataFileError` naming the file and column: a doubtful value is
never guessed.
"""

from deltastream.read.variant.encoding import EMPTY_METADATA, VARIANT_NULL, MalformedVariantError
from deltastream.read.variant.json_text import variant_array_to_json, variant_to_json
from deltastream.read.variant.shredding import read_variant_column

__all__ = [
    "EMPTY_METADATA",
    "VARIANT_NULL",
    "MalformedVariantError",
    "read_variant_column",
    "variant_array_to_json",
    "variant_to_json",
]
