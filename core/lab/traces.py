"""Trace import: Mooncake block traces and plain JSONL of token ids or texts.

Mooncake (FAST'25) lines: {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]},
one hash id per 512-token block, chained (equal ids at equal positions = identical prefix), the
last block possibly partial, so len(hash_ids) == ceil(input_length / 512).

Plain JSONL lines, one request each, any of:
    [1, 2, 3]                                            token ids
    {"input_ids": [...], "output_len": 8}               ("prompt_ids" / "tokens" also accepted)
    {"text": "...", "output_len": 8, "timestamp": 12}   ("prompt" also accepted; needs a tokenizer)
with optional "output_ids" (or "output" text), "output_len" / "output_length", "timestamp", "extra_key".
Texts need a `tokenizer(text) -> list[int]` passed in: the lab never loads a model itself.

Malformed lines (bad JSON, bad fields, bytes that are not UTF-8) raise ValueError naming the file and
line number; with on_error="skip" they are skipped and counted in `Workload.skipped_lines` instead.
Requests that all carry timestamps are replayed in timestamp order (`in_time_order`).
A file starting with the gzip magic is read through gzip, whatever its name (the bundled trace is
data/mooncake/synthetic_trace.jsonl.gz).

Hash ids are renumbered densely at load (first appearance = 0, 1, 2, ...): traces keyed by 64-bit
content hashes would otherwise collide with the ids the replay gives outputs, wrap in int64 or not
fit it at all. Equal ids stay equal and different ids stay different, so every hit rate is unchanged.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

from core.lab.workloads import TraceRequest, Workload

MOONCAKE_BLOCK = 512
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Shipped with the project (Apache-2.0, see data/mooncake/README.md): the lab page, the tests and the benchmarks read it.
MOONCAKE_SYNTHETIC = os.path.join(ROOT, "data", "mooncake", "synthetic_trace.jsonl.gz")
# Its conversation trace too: held out for the eviction research (docs/eviction.md), a real workload for the page.
MOONCAKE_CONVERSATION = os.path.join(ROOT, "data", "mooncake", "conversation_trace.jsonl.gz")
Tokenizer = Callable[[str], list]
PathLike = Union[str, "os.PathLike[str]"]


# A line longer than this is not a trace line (a binary file, /dev/zero): stop instead of running out of memory.
MAX_LINE_BYTES = 64 << 20
GZIP_MAGIC = b"\x1f\x8b"
OTHER_COMPRESSION = {b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
BOM = b"\xef\xbb\xbf"


def _open(path: PathLike) -> tuple[BinaryIO, BinaryIO]:
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
    f, raw = _open(path)
    try:
        lineno = 0
        while True:
            try:
                line = f.readline(MAX_LINE_BYTES + 1)
            except (OSError, EOFError, zlib.error) as e:
                raise ValueError(f"cannot read trace {name!r} after line {lineno}: {e}") from None
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


def _decode(line: bytes) -> Any:
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


def _int(obj: dict, name: str, minimum: int, required: bool = True) -> Optional[int]:
    if name not in obj:
        if required:
            raise ValueError(f"missing field {name!r}")
        return None
    v = obj[name]
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
            or int(v) != v or v < minimum):   # Infinity / NaN: json.loads reads them, int() would raise
        raise ValueError(f"field {name!r} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _number(obj: dict, name: str) -> Optional[float]:
    v = obj.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"field {name!r} must be a number, got {v!r}")
    return float(v)


def _int_list(v: Any, name: str, allow_empty: bool = False) -> list:
    if not isinstance(v, list) or (not v and not allow_empty):
        raise ValueError(f"{name} must be a non-empty list of integers")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{name} must hold non-negative integers, found {x!r}")
    return v


def check_limit(limit: Optional[int]) -> Optional[int]:
    """`limit` requests to read: None (all) or a positive integer."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive number of requests (or None for all), got {limit!r}")
    return limit


def _parse(path: PathLike, on_error: str, parse_line: Callable[[Any], TraceRequest], kind: str,
           limit: Optional[int]) -> tuple[list[TraceRequest], int]:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    check_limit(limit)
    reqs: list[TraceRequest] = []
    skipped = 0
    for lineno, line in _lines(path):
        if limit is not None and len(reqs) >= limit:
            break
        try:
            reqs.append(parse_line(_decode(line)))
        except ValueError as e:
            if on_error == "skip":
                skipped += 1
                continue
            raise ValueError(f"{os.fspath(path)}, line {lineno}: malformed {kind} line: {e} "
                             f"(pass on_error='skip' / --skip-bad-lines to skip such lines)") from None
    if not reqs:
        extra = f" ({skipped} malformed line(s) skipped)" if skipped else ""
        raise ValueError(f"trace {os.fspath(path)!r} holds no requests{extra}")
    return reqs, skipped


def in_time_order(reqs: list[TraceRequest]) -> tuple[list[TraceRequest], dict[str, int]]:
    """Requests that all have timestamps, in timestamp order (stable: ties keep the file's order), and
    {"reordered": how many moved} when the file had them otherwise. Merged logs are often unsorted, and
    a replay without --overlap follows the list: file order would be a workload that never happened."""
    if any(r.timestamp is None for r in reqs):
        return reqs, {}
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].timestamp)
    moved = sum(1 for k, i in enumerate(order) if k != i)
    return ([reqs[i] for i in order], {"reordered": moved}) if moved else (reqs, {})


def load_mooncake(path: PathLike, on_error: str = "raise", limit: Optional[int] = None,
                  block_size: int = MOONCAKE_BLOCK) -> Workload:
    """Read a Mooncake JSONL trace into a block-trace workload (hash id h -> ids h*512 .. h*512+511).

    Hash ids are renumbered densely in order of first appearance (see the module docstring)."""
    dense: dict[int, int] = {}

    def parse(obj: Any) -> TraceRequest:
        if not isinstance(obj, dict):
            raise ValueError("expected a JSON object with timestamp, input_length, output_length, hash_ids")
        n_in = _int(obj, "input_length", 1)
        n_out = _int(obj, "output_length", 0)
        if obj.get("timestamp") is None:   # Mooncake's lines all carry one; null read as "none" and
            raise ValueError("missing field 'timestamp'")   # left the trace half timed
        ts = _number(obj, "timestamp")
        if "hash_ids" not in obj:
            raise ValueError("missing field 'hash_ids'")
        ids = _int_list(obj["hash_ids"], "hash_ids")
        want = -(-n_in // block_size)
        if len(ids) != want:
            raise ValueError(f"input_length {n_in} needs ceil({n_in}/{block_size}) = {want} hash_ids, "
                             f"the line has {len(ids)}; if this trace's blocks are not {block_size} tokens "
                             f"(Alibaba's blksz_16 traces: 16), give their size (--block-size)")
        ids = [dense.setdefault(h, len(dense)) for h in ids]
        return TraceRequest(None, n_out, ts, hash_ids=ids, input_len=n_in, block_size=block_size)

    reqs, skipped = _parse(path, on_error, parse, "Mooncake", limit)
    reqs, moved = in_time_order(reqs)
    return Workload(os.path.basename(os.fspath(path)), reqs,
                    {"format": "mooncake", "block_size": block_size, **moved}, skipped)


def load_jsonl(path: PathLike, tokenizer: Optional[Tokenizer] = None, on_error: str = "raise",
               limit: Optional[int] = None, default_output_len: int = 1) -> Workload:
    """Read a plain JSONL trace of token-id lists or texts (texts need `tokenizer`)."""

    def tokenize(text: Any, name: str) -> list:
        if not isinstance(text, str) or not text:
            raise ValueError(f"{name} must be a non-empty string")
        if tokenizer is None:
            raise ValueError(f"the line holds text in {name!r}; pass a tokenizer (text -> token ids) to read texts")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:   # JSON's "\ud800" alone (a truncated emoji): no tokenizer takes it
            raise ValueError(f"{name} holds a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at character "
                             f"{e.start + 1}, which is no text; fix or drop that line") from None
        try:
            ids = tokenizer(text)
        except Exception as e:   # a tokenizer's own failure is this line's, not the run's
            raise ValueError(f"the tokenizer could not read {name} ({type(e).__name__}: {e})") from None
        return _int_list(list(ids), f"tokenized {name}")

    def parse(obj: Any) -> TraceRequest:
        if isinstance(obj, list):
            return TraceRequest(_int_list(obj, "the token-id list"), default_output_len)
        if not isinstance(obj, dict):
            raise ValueError("expected a list of token ids or a JSON object")
        for name in ("input_ids", "prompt_ids", "tokens"):
            if name in obj:
                prompt = _int_list(obj[name], name)
                break
        else:
            for name in ("text", "prompt"):
                if name in obj:
                    prompt = tokenize(obj[name], name)
                    break
            else:
                raise ValueError("no prompt: give input_ids / prompt_ids / tokens (token ids) or text / prompt")
        output = None
        if "output_ids" in obj:
            output = _int_list(obj["output_ids"], "output_ids", allow_empty=True)
        elif isinstance(obj.get("output"), str):
            output = tokenize(obj["output"], "output")
        elif obj.get("output") is not None:   # it was ignored, and the request ran with the default output
            raise ValueError(f"output must be text, got {type(obj['output']).__name__}; token ids go in output_ids")
        n_out = _int(obj, "output_len", 0, required=False)
        other = _int(obj, "output_length", 0, required=False)
        if n_out is not None and other is not None and n_out != other:
            raise ValueError(f"output_len {n_out} and output_length {other} disagree; give one")
        if n_out is None:
            n_out = other
        if output is not None and n_out is not None and n_out != len(output):
            raise ValueError(f"output_len {n_out} differs from the {len(output)} output tokens given")
        extra = obj.get("extra_key")
        if extra is not None and not isinstance(extra, str):
            raise ValueError(f"extra_key must be a string, got {extra!r}")
        return TraceRequest(prompt, default_output_len if n_out is None else n_out, _number(obj, "timestamp"),
                       output, extra_key=extra)

    reqs, skipped = _parse(path, on_error, parse, "JSONL", limit)
    reqs, moved = in_time_order(reqs)
    return Workload(os.path.basename(os.fspath(path)), reqs, {"format": "jsonl", **moved}, skipped)


DETECT_LINES = 100


def detect_format(path: PathLike) -> str:
    """"mooncake" when the first line that parses as JSON (of the first DETECT_LINES) has hash_ids, else
    "jsonl". A malformed first line does not decide: the loader then reports or skips it as usual."""
    for k, (_, line) in enumerate(_lines(path)):
        if k >= DETECT_LINES:
            break
        try:
            first = _decode(line)
        except ValueError:
            continue
        return "mooncake" if isinstance(first, dict) and "hash_ids" in first else "jsonl"
    return "jsonl"


def load_trace(path: PathLike, fmt: str = "auto", tokenizer: Optional[Tokenizer] = None,
               on_error: str = "raise", limit: Optional[int] = None, block_size: int = MOONCAKE_BLOCK) -> Workload:
    """Read a trace; fmt "auto" picks Mooncake when the first valid line has hash_ids, else plain JSONL.
    `block_size`: the tokens a hash id stands for in a Mooncake-format trace."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"the block size must be a positive number of tokens (a hash id's block), got {block_size!r}")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "mooncake":
        return load_mooncake(path, on_error, limit, block_size)
    if fmt == "jsonl":
        return load_jsonl(path, tokenizer, on_error, limit)
    raise ValueError(f"unknown trace format {fmt!r}; choose one of: auto, mooncake, jsonl")
