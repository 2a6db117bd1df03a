"""Deletion vectors: decoding them and turning them into row filters.

This module owns everything between a ``deletionVector`` descriptor in the log and the set of
soft-deleted row indexes of one data file:

* Z85 (ZeroMQ RFC 32), the Base85 variant of inline DVs and of ``u`` paths
  (:func:`decode_z85`, :func:`encode_z85`);
* the file name a ``u`` descriptor derives (:func:`relative_dv_path`);
* the serialized bitmap (:func:`parse_bitmap`), in both layouts found in the wild: magic
  1681511377 (little endian) followed by the 64-bit "portable" RoaringBitmap format, as the
  protocol specifies, and the older RoaringBitmapArray layout (magic 1681511376 written big
  endian, then a count and length-prefixed 32-bit bitmaps) that the protocol's own inline
  example uses;
* the DV file format, version 1: a version byte, then per DV a big-endian ``dataSize``, the
  bitmap and a big-endian CRC-32 of the bitmap. A descriptor's ``offset`` points at the
  ``dataSize`` field (it is 1 for the first DV of a file, just past the version byte)
  (:func:`parse_dv_file_slice`);
* loading a descriptor through an :class:`~deltastream.storage.base.ObjectStore`
  (:func:`load_deletion_vector`), checking the cardinality the log records; nothing is cached;
* row filters for readers: :func:`kept_rows` (an Arrow mask for a range of a file's rows),
  :func:`deleted_rows_mask` and :func:`max_row`.

Every problem with a DV is a :class:`~deltastream.errors.DeletionVectorError` naming the DV
file (or, for an inline DV, the data file) and what is wrong. ``u`` paths are resolved exactly
as the protocol says (``<prefix>/deletion_vector_<uuid>.bin``): Delta's own Spark test tables
carry files renamed with a test-only ``test%dv%prefix-`` name prefix that no reader can derive,
and they read as missing here, as in delta-kernel-rs.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyroaring import BitMap64

from deltastream.errors import DeletionVectorError, ObjectNotFoundError, UnsafePathError
from deltastream.log.actions import DeletionVectorDescriptor
from deltastream.storage.paths import is_absolute

if TYPE_CHECKING:
    from deltastream.storage.base import ObjectStore

__all__ = [
    "DV_FILE_FORMAT_VERSION",
    "MAGIC_NATIVE",
    "MAGIC_PORTABLE",
    "decode_z85",
    "deleted_rows_mask",
    "encode_z85",
    "kept_rows",
    "load_deletion_vector",
    "max_row",
    "parse_bitmap",
    "parse_dv_file_slice",
    "relative_dv_path",
]

#: The protocol's magic number: a 64-bit portable RoaringBitmap follows (little endian).
MAGIC_PORTABLE = 1681511377
#: The RoaringBitmapArray layout's magic number (written big endian).
MAGIC_NATIVE = 1681511376
#: The only DV file format version the protocol defines.
DV_FILE_FORMAT_VERSION = 1

# ------------------------------------------------------------------------------------- Z85

_Z85_ALPHABET = (
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # digits and letters
    ".-:+=^!/*?&<>()[]{}@%$#"
)
_Z85_ENCODE = np.frombuffer(_Z85_ALPHABET.encode("ascii"), dtype=np.uint8)
_Z85_DECODE = np.full(256, 255, dtype=np.uint8)
_Z85_DECODE[_Z85_ENCODE] = np.arange(85, dtype=np.uint8)
_POWERS_85 = np.array([85**4, 85**3, 85**2, 85, 1], dtype=np.uint64)


def decode_z85(text: str) -> bytes:
    """Decode Z85 text (ZeroMQ RFC 32): every 5 characters give 4 bytes, big endian.

    The last group may also use the padded tail of the Rust ``z85`` crate (which
    delta-kernel-rs writes inline DVs with): ``k`` leading ``#`` (1 to 3) followed by the
    ``5 - k`` digits of the final ``4 - k`` bytes. No standard group starts with ``#`` (its
    value would exceed 32 bits), so this reading is unambiguous.

    Raises :class:`ValueError` naming the problem if the length is not a multiple of 5, a
    character is not in the Z85 alphabet, or a group encodes a value that does not fit.
    """
    if len(text) % 5:
        raise ValueError(f"Z85 text must have a length that is a multiple of 5, not {len(text)}")
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as e:
        raise ValueError(f"invalid Z85 character {text[e.start]!r} at position {e.start}") from None
    digits = _Z85_DECODE[np.frombuffer(raw, dtype=np.uint8)]
    bad = np.flatnonzero(digits == 255)
    if bad.size:
        pos = int(bad[0])
        raise ValueError(f"invalid Z85 character {text[pos]!r} at position {pos}")
    tail = b""
    if text and text[-5] == "#":
        tail = _decode_padded_tail(text[-5:], len(text) - 5)
        digits = digits[:-5]
    values = digits.reshape(-1, 5).astype(np.uint64) @ _POWERS_85
    over = np.flatnonzero(values > 0xFFFFFFFF)
    if over.size:
        pos = int(over[0]) * 5
        raise ValueError(
            f"invalid Z85 group {text[pos : pos + 5]!r} at position {pos}: value exceeds 32 bits"
        )
    return values.astype(">u4").tobytes() + tail


def _decode_padded_tail(group: str, pos: int) -> bytes:
    missing = len(group) - len(group.lstrip("#"))
    if missing > 3:
        raise ValueError(f"invalid Z85 group {group!r} at position {pos}")
    value = 0
    for char in group[missing:]:
        value = value * 85 + _Z85_ALPHABET.index(char)
    size = 4 - missing
    if value >= 1 << (8 * size):
        raise ValueError(
            f"invalid Z85 tail group {group!r} at position {pos}: value exceeds {size} byte(s)"
        )
    return value.to_bytes(size, "big")


def encode_z85(data: bytes) -> str:
    """Encode bytes as Z85; ``len(data)`` must be a multiple of 4 (pad it first)."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes a multiple of 4 bytes, not {len(data)}")
    values = np.frombuffer(data, dtype=">u4").astype(np.uint64)
    digits = (values[:, None] // _POWERS_85[None, :]) % np.uint64(85)
    return _Z85_ENCODE[digits.astype(np.intp)].tobytes().decode("ascii")


# ---------------------------------------------------------------------------------- u paths

_UUID_CHARS = 20


def relative_dv_path(path_or_inline_dv: str) -> str:
    """The DV file of a ``u`` descriptor, relative to the table root.

    ``pathOrInlineDv`` is ``<random prefix (optional)><20 Z85 characters of the UUID>``; the
    file is ``<prefix>/deletion_vector_<uuid>.bin``, or just the file name without a prefix.
    Raises :class:`ValueError` if the value is too short or its UUID part is not valid Z85.
    """
    if len(path_or_inline_dv) < _UUID_CHARS:
        raise ValueError(
            f"a 'u' deletion vector path needs at least {_UUID_CHARS} characters "
            f"(the Z85-encoded UUID), got {path_or_inline_dv!r}"
        )
    prefix = path_or_inline_dv[:-_UUID_CHARS]
    encoded = path_or_inline_dv[-_UUID_CHARS:]
    try:
        raw = decode_z85(encoded)
        if len(raw) != 16:
            raise ValueError(f"decodes to {len(raw)} bytes, not 16")
        dv_id = uuid.UUID(bytes=raw)
    except ValueError as e:
        raise ValueError(f"bad UUID {encoded!r} in deletion vector path: {e}") from None
    name = f"deletion_vector_{dv_id}.bin"
    return f"{prefix}/{name}" if prefix else name


# ---------------------------------------------------------------------------------- bitmaps

_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX_CARDINALITY = 4096
_BITSET_BYTES = 8192


class _Malformed(Exception):
    """Internal: the bitmap bytes are inconsistent (turned into a DeletionVectorError)."""


def _roaring32_end(data: bytes | memoryview, pos: int) -> int:
    """Where the 32-bit portable RoaringBitmap serialized at ``pos`` ends.

    pyroaring does not report how many bytes a bitmap used (and silently ignores some
    trailing bytes), so the layout is walked here to check that lengths add up exactly.
    See https://github.com/RoaringBitmap/RoaringFormatSpec.
    """
    size = len(data)

    def need(end: int, what: str) -> None:
        if end > size:
            raise _Malformed(f"truncated 32-bit bitmap: {what} needs {end - size} more byte(s)")

    need(pos + 4, "the cookie")
    (cookie,) = struct.unpack_from("<I", data, pos)
    run_flags: bytes | None
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        n = (cookie >> 16) + 1
        pos += 4
        need(pos + (n + 7) // 8, "the run-container flags")
        run_flags = bytes(data[pos : pos + (n + 7) // 8])
        pos += (n + 7) // 8
        has_offsets = n >= _NO_OFFSET_THRESHOLD
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        need(pos + 8, "the container count")
        (n,) = struct.unpack_from("<I", data, pos + 4)
        pos += 8
        run_flags = None
        has_offsets = True
        if n > 1 << 16:
            raise _Malformed(f"32-bit bitmap claims {n} containers (at most 65536 exist)")
    else:
        raise _Malformed(f"not a 32-bit RoaringBitmap: unknown cookie {cookie}")
    need(pos + 4 * n, "the container headers")
    header = struct.unpack_from(f"<{2 * n}H", data, pos)
    pos += 4 * n
    if has_offsets:
        need(pos + 4 * n, "the container offsets")
        pos += 4 * n
    previous_key = -1
    for i in range(n):
        key, cardinality = header[2 * i], header[2 * i + 1] + 1
        if key <= previous_key:
            raise _Malformed("32-bit bitmap container keys are not strictly ascending")
        previous_key = key
        if run_flags is not None and run_flags[i // 8] >> (i % 8) & 1:
            need(pos + 2, "a run container")
            (runs,) = struct.unpack_from("<H", data, pos)
            pos += 2 + 4 * runs
        elif cardinality > _ARRAY_MAX_CARDINALITY:
            pos += _BITSET_BYTES
        else:
            pos += 2 * cardinality
        need(pos, "a container")
    return pos


def _check_key(key: int) -> None:
    if key >= 1 << 31:
        raise _Malformed(
            f"bitmap key {key} has its most significant bit set (row indexes must be < 2**63)"
        )


def _parse_portable(data: bytes) -> BitMap64:
    """Magic (LE) + 64-bit portable format: u64 bucket count, then (u32 key, bitmap) each."""
    if len(data) < 12:
        raise _Malformed(f"truncated: {len(data)} bytes cannot hold a 64-bit bitmap header")
    (buckets,) = struct.unpack_from("<Q", data, 4)
    if buckets > (len(data) - 12) // 12:  # every bucket needs a key and a cookie at least
        raise _Malformed(f"claims {buckets} buckets, which {len(data)} bytes cannot hold")
    pos = 12
    previous_key = -1
    for _ in range(buckets):
        if pos + 4 > len(data):
            raise _Malformed("truncated: a bucket key is cut off")
        (key,) = struct.unpack_from("<I", data, pos)
        _check_key(key)
        if key <= previous_key:
            raise _Malformed("bucket keys are not strictly ascending")
        previous_key = key
        pos = _roaring32_end(data, pos + 4)
    if pos != len(data):
        raise _Malformed(f"{len(data) - pos} unexpected byte(s) after the bitmap")
    return BitMap64.deserialize(data[4:])


def _parse_native(data: bytes) -> BitMap64:
    """Magic (BE) + RoaringBitmapArray: i32 count, then (i32 length, 32-bit bitmap) each, big
    endian; bitmap ``i`` holds the low 32 bits of the values whose high 32 bits are ``i``."""
    if len(data) < 8:
        raise _Malformed(f"truncated: {len(data)} bytes cannot hold a bitmap array header")
    (count,) = struct.unpack_from(">i", data, 4)
    if count < 0 or count > (len(data) - 8) // 4:
        raise _Malformed(f"invalid bitmap count {count} for {len(data)} bytes")
    pos = 8
    # Re-frame as the 64-bit portable format, which pyroaring reads in one call.
    portable = [struct.pack("<Q", count)]
    for key in range(count):
        if pos + 4 > len(data):
            raise _Malformed(f"truncated: the length of bitmap {key} is cut off")
        (length,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise _Malformed(f"bitmap {key} claims {length} bytes but {len(data) - pos} remain")
        chunk = data[pos : pos + length]
        if _roaring32_end(chunk, 0) != length:
            raise _Malformed(f"bitmap {key} does not fill its {length} bytes exactly")
        portable.append(struct.pack("<I", key))
        portable.append(chunk)
        pos += length
    if pos != len(data):
        raise _Malformed(f"{len(data) - pos} unexpected byte(s) after the bitmap array")
    return BitMap64.deserialize(b"".join(portable))


def parse_bitmap(data: bytes, source: str) -> BitMap64:
    """Decode a serialized deletion vector (magic number + bitmap) into its row indexes.

    ``source`` names where the bytes came from, for messages. Any inconsistency (unknown
    magic number, truncation, lengths that do not add up, a key with its top bit set) raises
    :class:`~deltastream.errors.DeletionVectorError`.
    """
    if len(data) < 4:
        raise DeletionVectorError(
            source, f"deletion vector bitmap is truncated: {len(data)} byte(s), no magic number"
        )
    (magic_le,) = struct.unpack_from("<I", data, 0)
    (magic_be,) = struct.unpack_from(">I", data, 0)
    try:
        if magic_le == MAGIC_PORTABLE:
            return _parse_portable(data)
        if magic_be == MAGIC_NATIVE:
            return _parse_native(data)
    except _Malformed as e:
        raise DeletionVectorError(source, f"corrupt deletion vector bitmap: {e}") from None
    except Exception as e:  # pyroaring: ValueError, IndexError, ... on bytes we did not catch
        raise DeletionVectorError(
            source, f"corrupt deletion vector bitmap: {type(e).__name__}: {e}"
        ) from e
    raise DeletionVectorError(
        source,
        f"unknown deletion vector magic number {magic_le} (little endian; expected "
        f"{MAGIC_PORTABLE}, or {MAGIC_NATIVE} written big endian)",
    )


# --------------------------------------------------------------------------------- DV files


def _frame_size(descriptor: DeletionVectorDescriptor) -> int:
    return 4 + descriptor.size_in_bytes + 4


def parse_dv_file_slice(data: bytes, descriptor: DeletionVectorDescriptor, source: str) -> BitMap64:
    """Decode one DV from the bytes of a DV file starting at the descriptor's ``offset``.

    Those bytes are a big-endian ``dataSize`` (which must equal ``sizeInBytes``), the bitmap
    and a big-endian CRC-32 of the bitmap, which must match.
    """
    size = descriptor.size_in_bytes
    if len(data) < 4:
        raise DeletionVectorError(
            source,
            f"truncated deletion vector file: no dataSize field at offset {descriptor.offset}",
        )
    (data_size,) = struct.unpack_from(">I", data, 0)
    if data_size != size:
        raise DeletionVectorError(
            source,
            f"deletion vector at offset {descriptor.offset} has dataSize {data_size}, "
            f"but the log says sizeInBytes {size}",
        )
    if len(data) < 4 + size + 4:
        raise DeletionVectorError(
            source,
            f"truncated deletion vector file: the DV at offset {descriptor.offset} needs "
            f"{4 + size + 4} bytes, only {len(data)} are there",
        )
    bitmap = data[4 : 4 + size]
    (expected,) = struct.unpack_from(">I", data, 4 + size)
    actual = zlib.crc32(bitmap)
    if actual != expected:
        raise DeletionVectorError(
            source,
            f"deletion vector at offset {descriptor.offset} fails its checksum: "
            f"CRC-32 is {actual:#010x}, the file says {expected:#010x}",
        )
    return parse_bitmap(bitmap, source)


def _valid_key(key: str) -> bool:
    return bool(key) and not key.startswith("/") and ".." not in key.split("/")


async def load_deletion_vector(
    store: ObjectStore, descriptor: DeletionVectorDescriptor, *, data_file: str = ""
) -> BitMap64:
    """Read and decode the DV a descriptor points to; ``store`` is rooted at the table.

    ``data_file`` is the log path of the data file the DV belongs to, for messages. Inline
    DVs are decoded from the descriptor; ``u`` and ``p`` DVs take two ranged GETs (the version
    byte, then the DV's frame). The bitmap's cardinality must equal the descriptor's.
    """
    owner = data_file or "<unknown data file>"
    #: The data file by its place in the table, for errors that are about the log's action.
    where = f"{store.root_uri}/{data_file}" if data_file else store.root_uri
    kind = descriptor.storage_type
    if descriptor.size_in_bytes < 0:
        raise DeletionVectorError(
            where, f"deletion vector has a negative sizeInBytes {descriptor.size_in_bytes}"
        )
    if kind == "i":
        # An inline DV lives in the log: name the data file by its place in the table.
        source = where
        bitmap = _load_inline(descriptor, source)
    elif kind == "u":
        try:
            key = relative_dv_path(descriptor.path_or_inline_dv)
        except ValueError as e:
            raise DeletionVectorError(where, f"invalid deletion vector: {e}") from None
        if not _valid_key(key):
            # A prefix of ".." (both Z85 characters) leads out of the table.
            raise UnsafePathError(f"the deletion vector of {owner}", None, key, store.root_uri)
        source = store.uri_for(key)
        bitmap = await _load_from_file(store, key, descriptor, source, owner)
    elif kind == "p":
        # Where the table's external-paths setting allows a DV outside the root, it is read
        # from there; otherwise it is refused (UnsafePathError), naming the data file.
        location = descriptor.path_or_inline_dv
        if not is_absolute(location):
            raise DeletionVectorError(
                location,
                f"deletion vector of {owner} is stored by path (p), which must be absolute",
            )
        try:
            dv_store, key = store.resolve(location)
        except UnsafePathError:
            raise UnsafePathError(
                f"the deletion vector of {owner}", None, location, store.root_uri
            ) from None
        if not _valid_key(key):
            raise DeletionVectorError(
                descriptor.path_or_inline_dv, f"invalid deletion vector path of {owner}"
            )
        source = dv_store.uri_for(key)
        bitmap = await _load_from_file(dv_store, key, descriptor, source, owner)
    else:
        raise DeletionVectorError(
            where, f"unknown deletion vector storageType {kind!r} (expected u, i or p)"
        )
    if len(bitmap) != descriptor.cardinality:
        raise DeletionVectorError(
            source,
            f"deletion vector of {owner} holds {len(bitmap)} row(s), "
            f"but the log says its cardinality is {descriptor.cardinality}",
        )
    return bitmap


def _load_inline(descriptor: DeletionVectorDescriptor, source: str) -> BitMap64:
    try:
        raw = decode_z85(descriptor.path_or_inline_dv)
    except ValueError as e:
        raise DeletionVectorError(source, f"invalid inline deletion vector: {e}") from None
    size = descriptor.size_in_bytes
    # Z85 encodes whole 4-byte words: writers pad the bitmap with up to 3 bytes.
    if len(raw) < size or len(raw) - size > 3:
        raise DeletionVectorError(
            source,
            f"inline deletion vector decodes to {len(raw)} bytes, which does not match "
            f"sizeInBytes {size}" + (" (truncated)" if len(raw) < size else ""),
        )
    return parse_bitmap(raw[:size], source)


async def _load_from_file(
    store: ObjectStore, key: str, descriptor: DeletionVectorDescriptor, source: str, owner: str
) -> BitMap64:
    # Without an offset (writers always give one) the DV follows the version byte.
    offset = 1 if descriptor.offset is None else descriptor.offset
    if offset < 1:
        raise DeletionVectorError(
            source, f"invalid deletion vector offset {offset} (byte 0 is the format version)"
        )
    try:
        version = await store.get(key, byte_range=(0, 1))
        frame = await store.get(key, byte_range=(offset, offset + _frame_size(descriptor)))
    except ObjectNotFoundError:
        raise DeletionVectorError(
            source, f"deletion vector file is missing (needed by data file {owner})"
        ) from None
    if not version:
        raise DeletionVectorError(source, "deletion vector file is empty")
    if version[0] != DV_FILE_FORMAT_VERSION:
        raise DeletionVectorError(
            source,
            f"unsupported deletion vector file format version {version[0]} "
            f"(only {DV_FILE_FORMAT_VERSION} is defined)",
        )
    return parse_dv_file_slice(frame, descriptor, source)


# ------------------------------------------------------------------------------ row filters


def max_row(bitmap: BitMap64) -> int | None:
    """The largest deleted row index, or None for an empty DV.

    A reader compares it with the data file's row count: an index at or past the end means
    the DV does not belong to that file.
    """
    return int(bitmap.max()) if bitmap else None


def _rows_in_range(bitmap: BitMap64, start: int, stop: int) -> npt.NDArray[np.uint64]:
    """The DV's row indexes in ``[start, stop)``, sorted, without materializing the rest."""
    if stop <= start or not bitmap:
        return np.empty(0, dtype=np.uint64)
    lo = bitmap.rank(start - 1) if start > 0 else 0  # number of values < start
    hi = bitmap.rank(stop - 1)  # number of values < stop
    if hi <= lo:
        return np.empty(0, dtype=np.uint64)
    if lo == 0 and hi == len(bitmap):
        return np.asarray(bitmap.to_array(), dtype=np.uint64)
    return np.asarray(bitmap[lo:hi].to_array(), dtype=np.uint64)


def deleted_rows_mask(bitmap: BitMap64, num_rows: int) -> npt.NDArray[np.bool_]:
    """A boolean array over a file's ``num_rows`` rows, True where the row is deleted.

    Raises :class:`ValueError` if the DV names a row at or past ``num_rows``.
    """
    last = max_row(bitmap)
    if last is not None and last >= num_rows:
        raise ValueError(f"deletion vector deletes row {last}, but the file has {num_rows} rows")
    mask = np.zeros(num_rows, dtype=np.bool_)
    mask[_rows_in_range(bitmap, 0, num_rows).astype(np.intp)] = True
    return mask


def kept_rows(bitmap: BitMap64, start: int, length: int) -> pa.BooleanArray:
    """An Arrow mask for the file's rows ``[start, start + length)``: True where kept.

    Only the DV's values inside that range are extracted, so filtering a large file batch by
    batch costs time proportional to each batch (plus a logarithmic lookup).
    """
    if start < 0 or length < 0:
        raise ValueError(f"invalid row range: start {start}, length {length}")
    mask = np.ones(length, dtype=np.bool_)
    rows = _rows_in_range(bitmap, start, start + length)
    if rows.size:
        mask[(rows - np.uint64(start)).astype(np.intp)] = False
    result: pa.BooleanArray = pa.array(mask, type=pa.bool_())
    return result
