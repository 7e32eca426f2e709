"""A bounded reader of the Thrift compact protocol, just enough to read Parquet's footer and page headers.

pyarrow exposes neither page headers nor, safely, column-chunk metadata (materialising the latter can abort the
process, see reader.py), so the decode bounds read both here. Every length is checked against the bytes left
before anything is allocated, nesting is capped, and fields nobody asked for are skipped without building
objects: a hostile footer costs time linear in its bytes, never more memory than it holds.
"""

from __future__ import annotations

from collections.abc import Iterator

MAX_DEPTH = 16  # Parquet's footer nests about 6 deep (FileMetaData > RowGroup > ColumnChunk > ... > Statistics)

# compact-protocol type ids
BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
_FIXED_WIDTH = {BOOL_TRUE: 1, BOOL_FALSE: 1, BYTE: 1, DOUBLE: 8}  # in a list, a bool takes one byte
_VARINTS = {I16, I32, I64}


class ThriftError(ValueError):
    """The bytes are not the Thrift struct they should be; the reader turns it into a "corrupt" file."""


class CompactReader:
    """Reads compact-protocol values from `data[start:end]`; `pos` is where the next value starts."""

    def __init__(self, data: bytes | memoryview, start: int = 0, end: int | None = None) -> None:
        self.data = data  # bytes index faster than a memoryview; neither is copied
        self.pos = start
        self.end = len(data) if end is None else end
        if not 0 <= start <= self.end <= len(data):
            raise ThriftError(f"range {start}..{self.end} is outside {len(data)} bytes")

    def _byte(self) -> int:
        if self.pos >= self.end:
            raise ThriftError("ran out of bytes")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        data, pos, end = self.data, self.pos, min(self.end, self.pos + 10)  # at most 10 bytes (64 bits)
        value = shift = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return value
            shift += 7
        raise ThriftError("ran out of bytes" if end < self.pos + 10 else "varint longer than 10 bytes")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def _length(self, size: int, width: int = 1) -> int:
        """`size` elements of at least `width` bytes each must fit in what is left."""
        if size < 0 or size * width > self.end - self.pos:
            raise ThriftError(f"a container of {size} elements does not fit in {self.end - self.pos} bytes")
        return size

    def binary(self) -> bytes:
        size = self._length(self.varint())
        value = bytes(self.data[self.pos : self.pos + size])
        self.pos += size
        return value

    def list_header(self) -> tuple[int, int]:
        """(element type, size) of a list or set."""
        header = self._byte()
        size = header >> 4
        if size == 15:
            size = self.varint()
        kind = header & 0x0F
        return kind, self._length(size, _FIXED_WIDTH.get(kind, 1))

    def fields(self, depth: int = 0) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of the struct starting here, up to its stop byte.

        The caller reads or `skip`s each value before asking for the next field.
        """
        if depth > MAX_DEPTH:
            raise ThriftError(f"structs nested deeper than {MAX_DEPTH}")
        field_id = 0
        while True:
            if self.pos >= self.end:
                raise ThriftError("ran out of bytes")
            header = self.data[self.pos]
            self.pos += 1
            if header == 0:
                return
            kind, delta = header & 0x0F, header >> 4
            field_id = field_id + delta if delta else self.zigzag()
            yield field_id, kind

    def integer(self, kind: int) -> int:
        if kind not in _VARINTS:
            raise ThriftError(f"expected an integer, got type {kind}")
        return self.zigzag()

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise ThriftError(f"values nested deeper than {MAX_DEPTH}")
        if kind in (BOOL_TRUE, BOOL_FALSE):  # a struct field's bool is in its header
            return
        if kind in _VARINTS:
            self.varint()
        elif kind in (BYTE, DOUBLE):
            self._advance(_FIXED_WIDTH[kind])
        elif kind == BINARY:
            self._advance(self._length(self.varint()))
        elif kind in (LIST, SET):
            element, size = self.list_header()
            if element in _FIXED_WIDTH:
                self._advance(size * _FIXED_WIDTH[element])
            elif element in _VARINTS:  # the level histograms: one list per column chunk
                for _ in range(size):
                    self.varint()
            else:
                for _ in range(size):
                    self.skip(element, depth + 1)
        elif kind == MAP:
            size = self._length(self.varint(), 2)
            if size:
                types = self._byte()
                for _ in range(size):
                    self._skip_element(types >> 4, depth + 1)
                    self._skip_element(types & 0x0F, depth + 1)
        elif kind == STRUCT:
            for _, field_kind in self.fields(depth + 1):
                self.skip(field_kind, depth + 1)
        else:
            raise ThriftError(f"unknown compact type {kind}")

    def _skip_element(self, kind: int, depth: int) -> None:
        """Skips a map key or value: unlike a struct field, a bool there takes a byte."""
        if kind in (BOOL_TRUE, BOOL_FALSE):
            self._advance(1)
        else:
            self.skip(kind, depth)

    def _advance(self, size: int) -> None:
        if size > self.end - self.pos:
            raise ThriftError("ran out of bytes")
        self.pos += size
