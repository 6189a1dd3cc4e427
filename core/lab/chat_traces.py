"""Chat records: request logs and whole conversations, tokenized through a model's chat template.

The workloads prefix caching pays off on are chats, and they come as messages, not token ids:
    {"messages": [{"role": "user", "content": "..."}]}          an OpenAI chat request (a gateway's log)
    {"custom_id": ..., "body": {"messages": [...], ...}}        an OpenAI Batch API input line
    {"conversations": [{"from": "human", "value": "..."}, ...]} ShareGPT
    {"conversation": [{"role": "user", "content": "..."}, ...]} LMSYS-Chat-1M, WildChat
    [{"role": "user", "content": "..."}, ...]                   a bare list of messages
Messages that end with the assistant's answer are a whole conversation: one request per answer, its prompt
all that came before (with the generation prompt), its output the tokens the template writes for the answer.
The next turn then finds that answer cached, as on a real engine whose model gave it. (A template that rewrites
earlier turns, as some drop a reasoning model's thinking, breaks that reuse on a real engine too: the answer
then gets fresh output ids.) Messages that end with any other turn are one request, as the engine would get it.

Conversations replay `sessions` at a time, turn by turn in turn: a real server's chats are in progress side by
side, and how many decides how long an answer waits in the pool for its next turn (1 runs each conversation
to its end; the number of conversations sends every first turn before any second one). A new conversation
takes the place of one that ended, in file order, so a log of single requests keeps its order.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from core.engine.inputs import CHAT_ROLES, chat_ids, join_text_parts
from core.lab.workloads import TraceRequest

DEFAULT_SESSIONS = 16
PROMPT_FIELDS = ("input_ids", "prompt_ids", "tokens", "text", "prompt")   # what a record of ids or text holds
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "function": "tool"}


@dataclass(frozen=True)
class ChatTokenizer:
    """A model's chat template as the lab needs it (no model, no transformers import here)."""

    template: Callable[[list, bool], list]   # (messages, add_generation_prompt) -> token ids
    stop_ids: frozenset = frozenset()        # the token a model ends its answer with (EOS): an output ends there,
    #                                          not at the template's newline after it, which no model generates


def hf_chat(tokenizer: Any, stop_ids: Iterable[int] = ()) -> Optional[ChatTokenizer]:
    """A Hugging Face tokenizer's chat template (as the engine applies it), or None when it has none.
    `stop_ids`: the model's other end-of-answer ids (its generation_config's and config's eos_token_id, as the
    engine stops on them all), next to the tokenizer's EOS."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None

    def template(messages: list, generation_prompt: bool) -> list:
        return chat_ids(tokenizer, messages, generation_prompt)

    eos = getattr(tokenizer, "eos_token_id", None)
    return ChatTokenizer(template, frozenset([eos] if isinstance(eos, int) else []) | frozenset(stop_ids))


def check_sessions(sessions: Any) -> int:
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise ValueError(f"sessions must be a positive number of conversations in progress at once, got {sessions!r}")
    return sessions


def _text(content: Any, where: str, role: str) -> str:
    """A message's text: a string, or OpenAI's list of parts when they are all text; none only for an assistant's
    or a tool's turn (one that only called tools), as the server takes them."""
    if content is None:
        if role in ("user", "system", "developer"):
            raise ValueError(f"{where} ({role}) has no content; give it text (the server refuses it too)")
        return ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where} holds a {kind!r} part; the lab replays text only (drop the line or "
                                 f"keep its text parts)")
            parts.append(part["text"])
        text = join_text_parts(parts)
    else:
        raise ValueError(f"{where}'s content must be text, got {type(content).__name__}")
    return check_text(text, where)


def check_text(text: str, where: str) -> str:
    """`text` when it is text a tokenizer takes: JSON's "\\ud800" alone (a truncated emoji) is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where} holds a lone UTF-16 surrogate (\\u{ord(text[e.start]):04x}) at character "
                         f"{e.start + 1}, which is no text; fix or drop that line") from None
    return text


def _message(m: Any, k: int, sharegpt: bool) -> dict:
    where = f"message {k}"
    if not isinstance(m, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(m).__name__}")
    if sharegpt:
        who = m.get("from")
        if not isinstance(who, str) or who not in SHAREGPT_ROLES:
            raise ValueError(f"{where} is from {who!r}; ShareGPT turns are from one of: {', '.join(SHAREGPT_ROLES)}")
        role = SHAREGPT_ROLES[who]
        return {"role": role, "content": _text(m.get("value"), where, role)}
    role = m.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        raise ValueError(f"{where}'s role is {role!r}; give one of: {', '.join(CHAT_ROLES)}")
    return {"role": role, "content": _text(m.get("content"), where, role)}


def chat_messages(record: Any) -> Optional[list]:
    """The record's messages as [{"role", "content"}] text, or None when it is no chat record (a record with
    token ids or text is not, whatever other fields it keeps: `conversation` is an id in OpenAI's logs)."""
    sharegpt = False
    if isinstance(record, list):
        if not (record and all(isinstance(m, dict) for m in record)):
            return None                     # token ids
        raw = record
    elif not isinstance(record, dict) or any(k in record for k in PROMPT_FIELDS):
        return None
    elif "messages" in record:
        raw = record["messages"]
    elif isinstance(record.get("body"), dict) and "messages" in record["body"]:
        raw = record["body"]["messages"]
    elif "conversations" in record:
        raw, sharegpt = record["conversations"], True
    elif isinstance(record.get("conversation"), list):
        raw = record["conversation"]
    else:
        return None
    if not isinstance(raw, list) or not raw:
        raise ValueError("the chat's messages must be a non-empty list")
    return [_message(m, k, sharegpt) for k, m in enumerate(raw, 1)]


def _template(chat: ChatTokenizer, messages: list, generation_prompt: bool) -> list:
    try:
        out = chat.template(messages, generation_prompt)
    except Exception as e:   # a template's own failure (roles it refuses, a missing template) is this line's
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"the chat template could not read these messages ({type(e).__name__}: {reason[:200]})") from None
    try:
        ids = np.asarray(out)
    except (ValueError, TypeError, OverflowError):
        ids = np.zeros(0)
    if ids.ndim != 1 or not ids.size or ids.dtype.kind not in "iu" or int(ids.min()) < 0:
        raise ValueError("the chat template gave no token ids for these messages")
    return ids.tolist()


def _answered(chat: ChatTokenizer, before: list, answer: dict, stops: frozenset) -> TraceRequest:
    """The request that produced `answer` after `before`: the template's tokens for the answer as its output,
    through the first stop token."""
    prompt = _template(chat, before, True)
    full = _template(chat, before + [answer], False)
    if len(full) > len(prompt) and full[:len(prompt)] == prompt:
        output = full[len(prompt):]
        end = next((i + 1 for i, t in enumerate(output) if t in stops), len(output))
        return TraceRequest(prompt, output=output[:end])
    same = next((i for i, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
    return TraceRequest(prompt, max(1, len(full) - same))   # a template that rewrites history: nothing to reuse


def conversation(chat: ChatTokenizer, messages: list) -> Iterator[TraceRequest]:
    """One request per assistant message that answers something, in order (a leading assistant message, such as
    an app's greeting, is context: no prompt produced it). Yields turn by turn, so a caller can stop early."""
    stops = frozenset(chat.stop_ids)
    asked = False
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            asked = True
        elif asked:
            yield _answered(chat, messages[:i], m, stops)


def chat_prompt(chat: ChatTokenizer, messages: list) -> list:
    """One request's prompt ids: the messages with the generation prompt, as the engine reads a chat."""
    return _template(chat, messages, True)


def answered_request(chat: ChatTokenizer, messages: list, output_text: Any) -> TraceRequest:
    """A request whose answer the record gives as text: tokenized as the template writes that answer."""
    answer = {"role": "assistant", "content": _text(output_text, "the output", "assistant")}
    return _answered(chat, messages, answer, frozenset(chat.stop_ids))


def interleave(conversations: list[list[TraceRequest]], sessions: int) -> list[TraceRequest]:
    """Turns in the order `sessions` conversations in progress at once send them (see the module docstring)."""
    pending = deque(c for c in conversations if c)
    active = deque((pending.popleft(), 0) for _ in range(min(sessions, len(pending))))
    out = []
    while active:
        turns, k = active.popleft()
        out.append(turns[k])
        if k + 1 < len(turns):
            active.append((turns, k + 1))
        elif pending:
            active.append((pending.popleft(), 0))
    return out
