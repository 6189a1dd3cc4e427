"""How big a prompt is before it is tokenized: enough to refuse one that can never fit without spending a worker
thread's minute on it (a chat template renders and tokenizes megabytes slowly, and the workers are shared)."""
from __future__ import annotations

from typing import Any

COUNTED_ROLES = ("user", "assistant")   # the roles every chat template renders, each with a header of its own


def prompt_chars(prompt: Any) -> int:
    """Characters of a text prompt or of chat messages' roles and contents (0 for token ids)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, (list, tuple)):
        return sum(len(m["role"]) + len(m["content"]) for m in prompt
                   if isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str))
    return 0


def counted_messages(prompt: Any) -> int:
    """User and assistant messages of a chat prompt (0 for text or token ids)."""
    if not isinstance(prompt, (list, tuple)):
        return 0
    return sum(1 for m in prompt if isinstance(m, dict) and m.get("role") in COUNTED_ROLES)


def tokens_per_message(tokenize: Any) -> int:
    """The fewest tokens the chat template adds for one empty user or assistant message (its role header),
    measured through `tokenize` (a chat -> (ids, text)); 0 where the template cannot be measured. A chat of more
    such messages than a pool holds tokens cannot fit, whatever their contents: 240,000 empty messages had
    passed the character check and held a worker for a minute."""
    turns = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": ""}]
    try:
        sizes = [len(tokenize(turns[:n])[0]) for n in (1, 2, 3)]
    except Exception:         # a template that refuses these shapes: no bound from it
        return 0
    return max(0, min(sizes[1] - sizes[0], sizes[2] - sizes[1]))
