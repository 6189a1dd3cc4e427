"""A trace file as a stream of JSON records: one a line (JSONL), or the elements of one JSON array.

Datasets come both ways: logs and Mooncake traces are JSONL; ShareGPT and many exports are one JSON array
written over many lines (`[\\n  {"id": ...}, ...]`). A file whose first line starts a JSON array it does not
finish is read as such an array, element by element, so a 600 MB dataset never sits in memory as text.

A record is (where, value): where names it for error messages ("line 7", "element 12"); value is the decoded
JSON, or the ValueError that says why it does not decode, so the caller reports or skips it like any other
malformed record. A runaway line and a broken array cannot be skipped (nothing after them can be found).
A file starting with the gzip magic is read through gzip, whatever its name.
"""
from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from typing import Any, BinaryIO, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]

# A line longer than this is not a trace line (a binary file, /dev/zero): stop instead of running out of memory.
MAX_LINE_BYTES = 64 << 20
MAX_ELEMENT_CHARS = MAX_LINE_BYTES   # one array element, likewise
READ_CHUNK = 1 << 20
PEEK_BYTES = 1 << 16    # what is read of a file to tell a JSON array from JSONL
GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSION = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
BOM = b"\xef\xbb\xbf"
WHITESPACE = " \t\r\n"


def open_trace(path: PathLike) -> tuple[BinaryIO, BinaryIO]:
    """(stream, file): the file as bytes, gunzipped on the fly when it starts with the gzip magic (any name)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ValueError(f"cannot read trace {os.fspath(path)!r}: {e.strerror or e}") from None
    try:
        head = f.peek(6)[:6]
        if head[:2] == GZIP_MAGIC:
            return gzip.GzipFile(fileobj=f, mode="rb"), f   # closing the GzipFile leaves f open
        kind = next((k for magic, k in OTHER_COMPRESSION.items() if head.startswith(magic)), None)
        if kind is not None:
            f.close()
            raise ValueError(f"trace {os.fspath(path)!r} is {kind}-compressed; the lab reads plain or gzipped "
                             f"JSONL: decompress it (or gzip it) first")
    except OSError as e:
        f.close()
        raise ValueError(f"cannot read trace {os.fspath(path)!r}: {e.strerror or e}") from None
    return f, f


def _lines(path: PathLike) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of every non-blank line. Decoding is the caller's, so a bad byte is a
    malformed line like any other (named, skippable); a runaway line is an error that cannot be skipped."""
    name = os.fspath(path)
    f, raw = open_trace(path)
    try:
        lineno = 0
        while True:
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as e:
                where = f"after line {lineno}" if lineno else "at its start"
                raise ValueError(f"cannot read trace {name!r} {where}: {e}") from None
            if not line:
                return
            lineno += 1
            if lineno == 1 and line.startswith(BOM):   # editors on Windows write one; JSON has no place for it
                line = line[len(BOM):]
            if len(line) > MAX_LINE_BYTES:
                raise ValueError(f"{name}, line {lineno}: longer than {MAX_LINE_BYTES >> 20} MiB without a line "
                                 f"break; this is not a JSONL trace (one JSON request per line)")
            if line.strip():
                yield lineno, line
    finally:
        f.close()
        raw.close()


def decode(line: bytes) -> Any:
    """One JSONL line's value; ValueError (what is wrong, no position) when it is not UTF-8 JSON."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    except RecursionError:   # [[[[... a hundred thousand deep: json's recursion, not a trace line
        raise ValueError("JSON nested too deeply to be a request") from None


def is_json_array_document(path: PathLike) -> bool:
    """True when the file opens a JSON array of objects (or of token-id lists) that its first line does not close:
    `[` alone, `[{` / `[[` or `[{...},` that go on in the next line, or (of objects) one line longer than
    PEEK_BYTES (a minified array, however long).
    A JSONL line of token ids (`[1, 2, 3]`) or of messages is complete on its own line, and a broken one (`[1, 2`,
    `[{"role": "user"}`) stays a malformed line of a JSONL file, to report or skip."""
    f, raw = open_trace(path)
    try:
        try:
            head = f.read(PEEK_BYTES)
        except (OSError, EOFError, zlib.error):
            return False                   # the JSONL reader says what is wrong with it, and where
    finally:
        f.close()
        raw.close()
    text = head.removeprefix(BOM).lstrip()
    line, newline, _ = text.partition(b"\n")
    line = line.strip()
    if line == b"[":
        return True
    inner = line[1:].lstrip()
    if not (line.startswith(b"[") and inner.startswith((b"{", b"["))):   # of objects or of id lists
        return False
    if inner.startswith(b"[") and not newline:
        return False                       # one line of id lists (or of deep nesting): a JSONL line says what it is
    if not newline:
        return len(head) == PEEK_BYTES     # cut by the peek: a long one-line array (a short one is a JSONL line)
    try:
        decode(line)
    except ValueError:
        return line.endswith((b",", b"{", b"[", b":"))
    return False


class _ArrayReader:
    """The elements of one JSON array, decoded one at a time from a text buffer refilled in chunks."""

    def __init__(self, stream: BinaryIO, name: str) -> None:
        self.stream, self.name = stream, name
        self.text = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.eof, self.started, self.offset = "", 0, False, False, 0
        self.decoder = json.JSONDecoder()

    def fill(self, at_least: int = 0) -> bool:
        """Read more of the file into the buffer (dropping what is parsed); False at the end of the file."""
        if self.eof:
            return False
        try:
            data = self.stream.read(max(at_least, READ_CHUNK))
            more = self.text.decode(data, final=not data)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"cannot read trace {self.name!r}: {e}") from None
        except UnicodeDecodeError as e:     # e.start counts from this read's bytes (a split character's too)
            at = self.offset + e.start - len(self.text.getstate()[0])
            raise ValueError(f"{self.name}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {max(at, 0):,}); "
                             f"a JSON array file must be UTF-8 throughout") from None
        self.offset += len(data)
        if not data:
            self.eof = True
        if not self.started and more:      # an editor's byte order mark before the array: JSON has no place for it
            more, self.started = more.removeprefix("\ufeff"), True
        self.buf = self.buf[self.pos:] + more
        self.pos = 0
        return True

    def next_char(self) -> str:
        """The next non-blank character (not consumed); "" at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in WHITESPACE:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def element(self, index: int) -> Any:
        """Decode the element at the cursor, reading on while it is cut off by the buffer's end."""
        want = READ_CHUNK
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                error = e.msg
            except RecursionError:
                raise ValueError(f"{self.name}, element {index}: JSON nested too deeply to be a request") from None
            else:
                # an object, array or string ends with its closing character, so it is whole; a number, true, false
                # or null is whole only where a delimiter follows it (a read can cut 1.5 after "1.")
                if self.eof or isinstance(value, (dict, list, str)) or (
                        end < len(self.buf) and self.buf[end] in ",]" + WHITESPACE):
                    self.pos = end
                    return value
                error = "cut off"
            if len(self.buf) - self.pos > MAX_ELEMENT_CHARS:
                raise ValueError(f"{self.name}, element {index}: larger than {MAX_ELEMENT_CHARS >> 20} MiB or not "
                                 f"valid JSON ({error}); this is not a trace of requests")
            if not self.fill(want):
                raise ValueError(f"{self.name}, element {index}: not valid JSON ({error}); a broken JSON array "
                                 f"cannot be read past it: fix the file, or write it as JSONL (one record a line)")
            want *= 2

    def elements(self) -> Iterator[tuple[int, Any]]:
        if self.next_char() != "[":
            raise ValueError(f"{self.name}: expected a JSON array")
        self.pos += 1
        index = 0
        while True:
            c = self.next_char()
            if c == "]" and index == 0:
                self.pos += 1
                break
            index += 1
            yield index, self.element(index)
            c = self.next_char()
            self.pos += 1
            if c == "]":
                break
            if c != ",":
                raise ValueError(f"{self.name}, after element {index}: expected ',' or ']', found "
                                 f"{c or 'the end of the file'!r}; fix the file, or write it as JSONL")
            if self.next_char() == "]":
                raise ValueError(f"{self.name}, after element {index}: a comma before the closing ']' (JSON allows "
                                 f"none there); remove it")
        if self.next_char():
            raise ValueError(f"{self.name}: text after the JSON array's closing ']'; a JSON array file holds one array")


def records(path: PathLike) -> Iterator[tuple[str, Any]]:
    """(where, value or ValueError) for every record of the file: its lines, or its array's elements."""
    name = os.fspath(path)
    if is_json_array_document(path):
        f, raw = open_trace(path)
        try:
            for index, value in _ArrayReader(f, name).elements():
                yield f"element {index}", value
        finally:
            f.close()
            raw.close()
        return
    for lineno, line in _lines(path):
        try:
            value = decode(line)
        except ValueError as e:
            value = e
        if _is_record_list(value):   # a JSON array of records written on one line
            for index, item in enumerate(value, 1):
                yield f"line {lineno}, element {index}", item
            continue
        yield f"line {lineno}", value


def _is_record_list(value: Any) -> bool:
    """A list of JSON objects that are not chat messages (a line of messages is one chat request), or of token-id
    lists (`json.dump(list_of_id_lists)`: no one record is a list of lists)."""
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(v, dict) for v in value):
        return not any("role" in v for v in value)
    return all(isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v) for v in value)
