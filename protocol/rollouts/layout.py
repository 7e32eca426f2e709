"""What a Parquet file declares about its column chunks and pages, read without decoding a single value.

The footer's column chunks say how many values each holds (`num_values`: levels, so a list column counts its
elements) and where their pages are; each page header says how many values that page decodes to. pyarrow trusts
the page headers and reads pages until it has seen the chunk's `num_values` (parquet-cpp `SerializedPageReader`),
so `walk_pages` walks the same byte range under the same rule: once the page headers agree with the footer, the
footer's counts bound what decoding produces. Offsets and ranges mirror parquet-cpp's `ComputeColumnChunkRange`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.rollouts.compact import BINARY, LIST, STRUCT, CompactReader, ThriftError

# Parquet PageType, and the PageHeader field holding each type's own header (whose field 1 is num_values)
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = range(4)
_VALUES_HEADER = {DATA_PAGE: 5, DICTIONARY_PAGE: 7, DATA_PAGE_V2: 8}


class LayoutError(ThriftError):
    """The footer or a page header is malformed or disagrees with the footer."""


class TooManyPages(LayoutError):
    """More pages than the caller will walk."""


@dataclass(frozen=True)
class Chunk:
    """One column chunk as the footer declares it."""

    name: str  # path in the schema, dotted ("input_tokens.list.element")
    num_values: int  # levels: one per scalar value, per list element, per empty list or null
    total_uncompressed_size: int  # page headers and decompressed pages (encoded: a dictionary page is not expanded)
    total_compressed_size: int
    data_page_offset: int
    dictionary_page_offset: int | None


@dataclass(frozen=True)
class RowGroup:
    num_rows: int
    total_byte_size: int
    columns: tuple[Chunk, ...]


@dataclass(frozen=True)
class Footer:
    num_rows: int
    row_groups: tuple[RowGroup, ...]


@dataclass(frozen=True)
class ChunkPages:
    """What the pages pyarrow reads of one chunk hold, by their headers."""

    values: int  # values of the data pages read; equal to the chunk's num_values (walk_pages refuses otherwise)
    uncompressed: int  # bytes those pages decompress to
    pages: int
    dictionary_bytes: int  # uncompressed size of the dictionary page among them, 0 without one


def read_footer(data: bytes | memoryview) -> Footer:
    """The row groups and column chunks of a file that ends in `<footer><uint32 length>PAR1`."""
    if len(data) < 12:
        raise LayoutError("too short for a footer")
    (length,) = struct.unpack_from("<I", data, len(data) - 8)
    start = len(data) - 8 - length
    if start < 4:
        raise LayoutError(f"a footer of {length} bytes does not fit in {len(data)}")
    reader = CompactReader(data, start, len(data) - 8)
    num_rows: int | None = None
    groups: list[RowGroup] = []
    for field_id, kind in reader.fields():
        if field_id == 3:
            num_rows = reader.integer(kind)
        elif field_id == 4 and kind == LIST:
            element, size = reader.list_header()
            groups.extend(_row_group(reader, element) for _ in range(size))
        else:
            reader.skip(kind)
    if num_rows is None:
        raise LayoutError("the footer has no num_rows")
    return Footer(num_rows, tuple(groups))


def _row_group(reader: CompactReader, kind: int) -> RowGroup:
    _expect(kind, STRUCT, "row group")
    num_rows = total_byte_size = None
    columns: list[Chunk] = []
    for field_id, field_kind in reader.fields(1):
        if field_id == 1 and field_kind == LIST:
            element, size = reader.list_header()
            columns.extend(_column_chunk(reader, element) for _ in range(size))
        elif field_id == 2:
            total_byte_size = reader.integer(field_kind)
        elif field_id == 3:
            num_rows = reader.integer(field_kind)
        else:
            reader.skip(field_kind, 1)
    if num_rows is None or total_byte_size is None:
        raise LayoutError("a row group without num_rows or total_byte_size")
    return RowGroup(num_rows, total_byte_size, tuple(columns))


def _column_chunk(reader: CompactReader, kind: int) -> Chunk:
    _expect(kind, STRUCT, "column chunk")
    chunk: Chunk | None = None
    for field_id, field_kind in reader.fields(2):
        if field_id == 3:
            _expect(field_kind, STRUCT, "column metadata")
            chunk = _column_meta(reader)
        elif field_id in (8, 9):  # crypto_metadata, encrypted_column_metadata
            raise LayoutError("encrypted columns are not read")
        else:
            reader.skip(field_kind, 2)
    if chunk is None:
        raise LayoutError("a column chunk without metadata")
    return chunk


def _column_meta(reader: CompactReader) -> Chunk:
    found: dict[int, int] = {}
    path: list[str] = []
    for field_id, kind in reader.fields(3):
        if field_id in (5, 6, 7, 9, 11):
            found[field_id] = reader.integer(kind)
        elif field_id == 3 and kind == LIST:
            element, size = reader.list_header()
            _expect(element, BINARY, "path_in_schema")
            path = [reader.binary().decode("utf-8", "replace") for _ in range(size)]
        else:
            reader.skip(kind, 3)
    missing = {5, 6, 7, 9} - found.keys()
    if missing:
        raise LayoutError(f"column metadata without fields {sorted(missing)}")
    return Chunk(".".join(path), found[5], found[6], found[7], found[9], found.get(11))


def walk_pages(data: bytes | memoryview, chunk: Chunk, max_pages: int) -> ChunkPages:
    """Reads the page headers of `chunk` as pyarrow will: from its first page until its num_values are seen."""
    start = chunk.data_page_offset
    if chunk.dictionary_page_offset is not None and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    end = start + chunk.total_compressed_size
    if start < 0 or chunk.total_compressed_size < 0 or end > len(data):
        raise LayoutError(f"column {chunk.name!r} spans bytes {start}..{end} of a {len(data)}-byte file")
    pos, seen, uncompressed, pages, dictionary = start, 0, 0, 0, 0
    while seen < chunk.num_values:
        if pos >= end:
            raise LayoutError(f"column {chunk.name!r}: its pages hold {seen} values, its metadata {chunk.num_values}")
        pages += 1
        if pages > max_pages:
            raise TooManyPages(f"column {chunk.name!r} has more than the {max_pages} pages left to read")
        reader = CompactReader(data, pos, end)
        page_type, page_uncompressed, page_compressed, page_values = _page_header(reader)
        uncompressed += reader.pos - pos + page_uncompressed  # the header, then the page decompressed
        pos = reader.pos + page_compressed
        if pos > end:
            raise LayoutError(f"column {chunk.name!r}: a page runs past the end of its column chunk")
        if page_type == DICTIONARY_PAGE:
            dictionary += page_uncompressed
        elif page_type in (DATA_PAGE, DATA_PAGE_V2):
            seen += page_values
    if seen != chunk.num_values:  # the last page went past the count: pyarrow decodes all of it
        raise LayoutError(f"column {chunk.name!r}: its pages hold {seen} values, its metadata {chunk.num_values}")
    return ChunkPages(seen, uncompressed, pages, dictionary)


def _page_header(reader: CompactReader) -> tuple[int, int, int, int]:
    """(type, uncompressed size, compressed size, values) of a PageHeader; values is 0 for non-data pages."""
    found: dict[int, int] = {}
    values: dict[int, int] = {}  # num_values (field 1) of each page-type header present, by its field id
    for field_id, kind in reader.fields():
        if field_id in (1, 2, 3):
            found[field_id] = reader.integer(kind)
        elif field_id in _VALUES_HEADER.values():
            _expect(kind, STRUCT, "page header")
            for sub_id, sub_kind in reader.fields(1):
                if sub_id == 1:
                    values[field_id] = reader.integer(sub_kind)
                else:
                    reader.skip(sub_kind, 1)
        else:
            reader.skip(kind)
    if {1, 2, 3} - found.keys():
        raise LayoutError("a page header without its type or sizes")
    page_type, page_uncompressed, page_compressed = found[1], found[2], found[3]
    if page_uncompressed < 0 or page_compressed < 0:
        raise LayoutError("a page header with a negative size")
    if page_type not in _VALUES_HEADER:
        return page_type, page_uncompressed, page_compressed, 0  # an index page or unknown: pyarrow skips it
    count = values.get(_VALUES_HEADER[page_type])
    if count is None or count < 0:
        raise LayoutError(f"a page of type {page_type} without a non-negative num_values")
    return page_type, page_uncompressed, page_compressed, count


def _expect(kind: int, expected: int, what: str) -> None:
    if kind != expected:
        raise LayoutError(f"{what} has compact type {kind}, expected {expected}")
