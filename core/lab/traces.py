"""Trace import: Mooncake block traces, and JSONL (or a JSON array) of token ids, texts or chats.

Mooncake (FAST'25) lines: {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]},
one hash id per 512-token block, chained (equal ids at equal positions = identical prefix), the
last block possibly partial, so len(hash_ids) == ceil(input_length / 512).

Plain records, one request each (a line each, or the elements of one JSON array), any of:
    [1, 2, 3]                                            token ids
    {"input_ids": [...], "output_len": 8}               ("prompt_ids" / "tokens" also accepted)
    {"text": "...", "output_len": 8, "timestamp": 12}   ("prompt" also accepted; needs a tokenizer)
    {"messages": [{"role": "user", "content": "..."}]}  a chat, or a whole conversation (core.lab.chat_traces:
                                                         OpenAI, its Batch API, ShareGPT, LMSYS; needs a chat template)
with optional "output_ids" (or "output" text), "output_len" / "output_length" (with neither an output nor a
length, "max_tokens" / "max_completion_tokens": the cap taken as the length), "timestamp", "extra_key".
Texts need a `tokenizer(text) -> list[int]` and chats a `ChatTokenizer` passed in: the lab never loads a model.

Malformed records (bad JSON, bad fields, bytes that are not UTF-8) raise ValueError naming the file and
line (or element); with on_error="skip" they are skipped and counted in `Workload.skipped_lines` instead.
Requests that all carry timestamps are replayed in timestamp order (`in_time_order`); whole conversations
replay `sessions` at a time (`chat_traces.interleave`). Files may be gzipped (core.lab.json_records; the
bundled trace is data/mooncake/synthetic_trace.jsonl.gz).

Hash ids are renumbered densely at load (first appearance = 0, 1, 2, ...): traces keyed by 64-bit
content hashes would otherwise collide with the ids the replay gives outputs, wrap in int64 or not
fit it at all. Equal ids stay equal and different ids stay different, so every hit rate is unchanged.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterator, Optional, Union

from core.lab import workload_size
from core.lab.chat_traces import (DEFAULT_SESSIONS, ChatTokenizer, answered_request, chat_messages, chat_prompt,
                                  check_sessions, check_text, conversation, interleave)
from core.lab.json_records import records
from core.lab.workload_size import WorkloadTooLarge
from core.lab.workloads import TraceRequest, Workload

MOONCAKE_BLOCK = 512
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Shipped with the project (Apache-2.0, see data/mooncake/README.md): the lab page, the tests and the benchmarks read it.
MOONCAKE_SYNTHETIC = os.path.join(ROOT, "data", "mooncake", "synthetic_trace.jsonl.gz")
# Its conversation trace too: held out for the eviction research (docs/eviction.md), a real workload for the page.
MOONCAKE_CONVERSATION = os.path.join(ROOT, "data", "mooncake", "conversation_trace.jsonl.gz")
Tokenizer = Callable[[str], list]
PathLike = Union[str, "os.PathLike[str]"]


def _int(obj: dict, name: str, minimum: int, required: bool = True) -> Optional[int]:
    if name not in obj:
        if required:
            raise ValueError(f"missing field {name!r}")
        return None
    v = obj[name]
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
            or int(v) != v or v < minimum):   # Infinity / NaN: json.loads reads them, int() would raise
        raise ValueError(f"field {name!r} must be an integer >= {minimum}, got {shown(v)}")
    return int(v)


def shown(v: Any, most: int = 40) -> str:
    """`v` as an error quotes it: a 400-digit number or a long string cut to `most` characters."""
    text = repr(v)
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def _number(obj: dict, name: str) -> Optional[float]:
    v = obj.get(name)
    if v is None:
        return None
    try:        # a JSON integer past float's range: float() raises OverflowError, which is no ValueError
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
    except OverflowError:
        ok = False
    if not ok:
        raise ValueError(f"field {name!r} must be a finite number, got {shown(v)}")
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


def _parse(path: PathLike, on_error: str, parse_record: Callable[[Any], list[TraceRequest]], kind: str,
           limit: Optional[int]) -> tuple[list[list[TraceRequest]], int]:
    """The requests of each record (a conversation gives several), reading at most `limit` records: the first
    `limit` requests, in any order the caller makes of them, come from no more."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    check_limit(limit)
    groups: list[list[TraceRequest]] = []
    skipped = seen = 0
    held: Optional[str] = None     # where a first record `[]` stands: an empty JSON array, or an empty token list

    def parse(where: str, value) -> None:
        nonlocal skipped
        try:
            if isinstance(value, ValueError):
                raise value
            groups.append(parse_record(value))
        except WorkloadTooLarge as e:
            raise WorkloadTooLarge(f"{os.fspath(path)}, {where}: {e}") from None
        except ValueError as e:
            if on_error == "skip":
                skipped += 1
                return
            noun = "line" if where.startswith("line") and "element" not in where else "record"
            raise ValueError(f"{os.fspath(path)}, {where}: malformed {kind} {noun}: {e} "
                             f"(pass on_error='skip' / --skip-bad-lines to skip such lines)") from None

    for where, value in records(path):
        if limit is not None and len(groups) >= limit:
            break
        seen += 1
        if seen == 1 and value == []:   # known once the next record comes, or the file ends
            held = where
            continue
        if held is not None:            # more follow: that `[]` was an empty token-id list, malformed
            parse(held, [])
            held = None
        parse(where, value)
    if held is not None:
        raise ValueError(f"trace {os.fspath(path)!r} is an empty JSON array: it holds no requests")
    if not groups:
        extra = f" ({skipped} malformed line(s) skipped)" if skipped else ""
        raise ValueError(f"trace {os.fspath(path)!r} holds no requests{extra}")
    return groups, skipped


def in_time_order(reqs: list[TraceRequest]) -> tuple[list[TraceRequest], dict[str, int]]:
    """Requests that all have timestamps, in timestamp order (stable: ties keep the file's order), and
    {"reordered": how many moved} when the file had them otherwise; {"untimed": how many lack one} when only some
    have one (replayed in file order: `order_notes` says so). Merged logs are often unsorted, and
    a replay without --overlap follows the list: file order would be a workload that never happened."""
    untimed = sum(r.timestamp is None for r in reqs)
    if untimed:
        return reqs, ({"untimed": untimed} if untimed < len(reqs) else {})
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].timestamp)
    moved = sum(1 for k, i in enumerate(order) if k != i)
    return ([reqs[i] for i in order], {"reordered": moved}) if moved else (reqs, {})


def order_notes(workload: Workload) -> list[str]:
    """How the replay's order differs from the file's, a sentence each (the CLI prints them, the page shows them)."""
    p = workload.params
    notes = []
    if p.get("reordered"):
        notes.append(f"{p['reordered']:,} requests were out of timestamp order in the file: replayed in timestamp "
                     f"order")
    if p.get("untimed"):
        notes.append(f"{p['untimed']:,} of {len(workload):,} requests have no timestamp: the trace is replayed in "
                     f"file order, not in timestamp order")
    return notes


def load_mooncake(path: PathLike, on_error: str = "raise", limit: Optional[int] = None,
                  block_size: int = MOONCAKE_BLOCK) -> Workload:
    """Read a Mooncake JSONL trace into a block-trace workload (hash id h -> ids h*512 .. h*512+511).

    Hash ids are renumbered densely in order of first appearance (see the module docstring)."""
    dense: dict[int, int] = {}

    def parse(obj: Any) -> list[TraceRequest]:
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
        return [TraceRequest(None, n_out, ts, hash_ids=ids, input_len=n_in, block_size=block_size)]

    groups, skipped = _parse(path, on_error, parse, "Mooncake", limit)
    reqs, moved = in_time_order([r for g in groups for r in g])
    return Workload(os.path.basename(os.fspath(path)), reqs,
                    {"format": "mooncake", "block_size": block_size, **moved}, skipped)


def _output_len(obj: dict) -> Optional[int]:
    """The output length a record states (output_len / output_length), else None."""
    n_out = _int(obj, "output_len", 0, required=False)
    other = _int(obj, "output_length", 0, required=False)
    if n_out is not None and other is not None and n_out != other:
        raise ValueError(f"output_len {n_out} and output_length {other} disagree; give one")
    return other if n_out is None else n_out


def _max_tokens(obj: dict) -> Optional[int]:
    """A request's cap, max_completion_tokens / max_tokens (top level or in an OpenAI Batch line's body): the output
    length of a record that gives no output and no length (the most it could have generated), else None."""
    body = obj.get("body") if isinstance(obj.get("body"), dict) else {}
    for where in (obj, body):
        for name in ("max_completion_tokens", "max_tokens"):
            if where.get(name) is not None:
                return _int(where, name, 0)
    return None


def _turns(turns: Iterator[TraceRequest], extra: Optional[str]) -> Iterator[TraceRequest]:
    """A conversation's requests, each with the record's extra_key; a ValueError when it holds none."""
    none = True
    for t in turns:
        none = False
        t.extra_key = extra
        yield t
    if none:
        raise ValueError("no answer to replay: the conversation holds no assistant answer after a prompt")


def load_jsonl(path: PathLike, tokenizer: Optional[Tokenizer] = None, on_error: str = "raise",
               limit: Optional[int] = None, default_output_len: int = 1, chat: Optional[ChatTokenizer] = None,
               sessions: int = DEFAULT_SESSIONS) -> Workload:
    """Read records of token ids, texts (need `tokenizer`) or chats (need `chat`); see the module docstring.
    Whole conversations replay `sessions` at a time."""
    check_sessions(sessions)

    def tokenize(text: Any, name: str) -> list:
        if not isinstance(text, str) or not text:
            raise ValueError(f"{name} must be a non-empty string")
        if tokenizer is None:
            raise ValueError(f"the line holds text in {name!r}; pass a tokenizer (text -> token ids) to read texts")
        check_text(text, name)
        try:
            ids = tokenizer(text)
        except Exception as e:   # a tokenizer's own failure is this line's, not the run's
            raise ValueError(f"the tokenizer could not read {name} ({type(e).__name__}: {e})") from None
        return _int_list(list(ids), f"tokenized {name}")

    def prompt_of(obj: dict) -> list:
        for name in ("input_ids", "prompt_ids", "tokens"):
            if name in obj:
                return _int_list(obj[name], name)
        for name in ("text", "prompt"):
            if name in obj:
                return tokenize(obj[name], name)
        raise ValueError("no prompt: give input_ids / prompt_ids / tokens (token ids), text / prompt, or chat "
                         "messages (messages / conversations)")

    def chat_record(obj: dict, messages: list) -> tuple[list, Optional[list], Optional[int]]:
        """(prompt, output ids or None, output length or None) of one chat request."""
        if chat is None:
            raise ValueError("the line holds chat messages; pass a tokenizer with a chat template (--tokenizer) "
                             "to read chats")
        if "output" in obj and obj["output"] is not None:
            r = answered_request(chat, messages, obj["output"])
            return r.prompt_ids().tolist(), (r.output_ids().tolist() if r.has_output_ids else None), r.output_len
        return chat_prompt(chat, messages), None, None

    def parse(obj: Any) -> list[TraceRequest]:
        messages = chat_messages(obj)
        if isinstance(obj, list) and messages is None:
            return [TraceRequest(_int_list(obj, "the token-id list"), default_output_len)]
        if not isinstance(obj, (dict, list)):
            raise ValueError("expected a list of token ids or a JSON object")
        fields = obj if isinstance(obj, dict) else {}
        extra = fields.get("extra_key")
        if extra is not None and not isinstance(extra, str):
            raise ValueError(f"extra_key must be a string, got {extra!r}")
        output, text_len = None, None
        if messages is not None and messages[-1]["role"] == "assistant":
            if any(fields.get(k) is not None for k in ("output", "output_ids", "output_len", "output_length")):
                raise ValueError("the messages end with the assistant's answer and the line gives an output too; "
                                 "give one")
            if chat is None:
                raise ValueError("the line holds a chat conversation; pass a tokenizer with a chat template "
                                 "(--tokenizer) to read chats")
            return _turns(conversation(chat, messages), extra)
        if messages is not None:
            prompt, output, text_len = chat_record(fields, messages)
        else:
            prompt = prompt_of(fields)
        if "output_ids" in fields:
            if output is not None or text_len is not None:
                raise ValueError("give the output as output_ids or as output text, not both")
            output = _int_list(fields["output_ids"], "output_ids", allow_empty=True)
        elif messages is None and isinstance(fields.get("output"), str):
            output = tokenize(fields["output"], "output")
        elif messages is None and fields.get("output") is not None:   # it was ignored: the default output ran
            raise ValueError(f"output must be text, got {type(fields['output']).__name__}; token ids go in output_ids")
        n_out = _output_len(fields)
        given = len(output) if output is not None else text_len
        if given is not None and n_out is not None and n_out != given:
            raise ValueError(f"output_len {n_out} differs from the {given} output tokens given")
        if n_out is None:
            n_out = given if given is not None else _max_tokens(fields)
        if n_out is None:
            n_out = default_output_len
        return [TraceRequest(prompt, n_out, _number(fields, "timestamp"), output, extra_key=extra)]

    held = [0, 0]     # records read, prompt tokens held

    def parse_and_count(obj: Any) -> list[TraceRequest]:
        """parse(obj), counting its prompts' tokens turn by turn: a conversation repeats its history in every
        prompt, so one record can hold more than memory allows, and the count stops it before it does."""
        held[0] += 1
        reqs = []
        for r in parse(obj):
            held[1] += r.prompt_len
            if held[1] > workload_size.MAX_TRACE_TOKENS:
                cap = workload_size.MAX_TRACE_TOKENS
                fix = (f"read fewer with --limit {held[0] - 1:,} (limit=)" if held[0] > 1 else
                       "this record alone does (a conversation repeats its history in every prompt): drop or "
                       "split it")
                raise WorkloadTooLarge(f"the first {held[0]:,} record(s) hold more than {cap:,} prompt tokens, the "
                                       f"most the lab keeps in memory (8 bytes each); {fix}")
            reqs.append(r)
        return reqs

    groups, skipped = _parse(path, on_error, parse_and_count, "JSONL", limit)
    chats = sum(1 for g in groups if len(g) > 1)
    if chats:   # turns have no times of their own: `sessions` conversations take turns
        reqs, params = interleave(groups, sessions), {"conversations": chats, "sessions": sessions}
    else:
        reqs, params = in_time_order([r for g in groups for r in g])
    if limit is not None:
        reqs = reqs[:limit]
    return Workload(os.path.basename(os.fspath(path)), reqs, {"format": "jsonl", **params}, skipped)


DETECT_LINES = 100


def detect_format(path: PathLike) -> str:
    """"mooncake" when the first record that parses as JSON (of the first DETECT_LINES) has hash_ids, else
    "jsonl". A malformed first record does not decide: the loader then reports or skips it as usual."""
    for k, (_, value) in enumerate(records(path)):
        if k >= DETECT_LINES:
            break
        if not isinstance(value, ValueError):
            return "mooncake" if isinstance(value, dict) and "hash_ids" in value else "jsonl"
    return "jsonl"


def load_trace(path: PathLike, fmt: str = "auto", tokenizer: Optional[Tokenizer] = None,
               on_error: str = "raise", limit: Optional[int] = None, block_size: int = MOONCAKE_BLOCK,
               chat: Optional[ChatTokenizer] = None, sessions: int = DEFAULT_SESSIONS) -> Workload:
    """Read a trace; fmt "auto" picks Mooncake when the first valid record has hash_ids, else plain JSONL.
    `block_size`: the tokens a hash id stands for in a Mooncake-format trace; `chat` and `sessions`: how
    chat records are tokenized and their conversations replayed (core.lab.chat_traces)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"the block size must be a positive number of tokens (a hash id's block), got {block_size!r}")
    check_sessions(sessions)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "mooncake":
        return load_mooncake(path, on_error, limit, block_size)
    if fmt == "jsonl":
        return load_jsonl(path, tokenizer, on_error, limit, chat=chat, sessions=sessions)
    raise ValueError(f"unknown trace format {fmt!r}; choose one of: auto, mooncake, jsonl")
