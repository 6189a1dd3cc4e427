"""A walkthrough step told in the article's words, written from that step's events."""
from __future__ import annotations

from typing import Optional, Sequence

from core.cache.events import Event
from core.observe.snapshot import FREE_STALE, CacheSnapshot, PoolView
from radixui.figures.event_table import describe_event
from radixui.figures.fmt import TokenText, clean, slot_list


def explain_step(events: Sequence[Event], cache: CacheSnapshot, pool: PoolView, token_text: TokenText,
                 prompt_tokens: int, cached_tokens: int) -> list[str]:
    """Sentences for one step: the walk, any split, the lock, evictions, the alloc, the insert,
    and which freed slots still hold stale KV."""
    lines: list[str] = []
    match = next((e for e in events if e.kind == "match"), None)
    if match is not None:
        hit_nodes = [cache.node(i) for i in match.path if any(n.id == i for n in cache.nodes)]
        hit_slots = [s for n in hit_nodes for s in n.slots][:match.tokens_hit]
        if match.tokens_hit:
            lines.append(f"**Walk the tree.** {match.tokens_hit} of {prompt_tokens} prompt tokens hit the cache: "
                         f"slots {slot_list(hit_slots)} are reused and their prefill is skipped.")
        else:
            lines.append(f"**Walk the tree.** Nothing matches: all {prompt_tokens} tokens go through the forward pass.")
    for e in events:
        if e.kind == "split":
            lines.append(f"**Split.** {describe_event(e, token_text)} (the match stopped mid-edge).")
    if any(e.kind == "lock" for e in events) and match is not None and match.tokens_hit:
        lines.append("**Lock.** The matched path is locked so eviction cannot take the prefix this request uses.")
    evicts = [e for e in events if e.kind == "evict"]
    need = prompt_tokens - cached_tokens
    for e in evicts:
        lines.append(f"**Evict.** Out of free slots: the heap pops the least valuable leaf, "
                     f"'{clean(token_text(e.token_ids))}' (last used at time {e.last_access_time:g}); "
                     f"its {len(e.slots)} slots {slot_list(e.slots)} return to free_pages.")
    if evicts:
        freed = sum(len(e.slots) for e in evicts)
        if freed > need:
            lines.append(f"Eviction works a whole node at a time: {freed} slots came back though only {need} were needed.")
    for e in events:
        if e.kind == "alloc":
            lines.append(f"**Alloc.** alloc({len(e.slots)}) takes slots {slot_list(e.slots)} from the front of free_pages.")
    for e in events:
        if e.kind == "insert":
            lines.append(f"**Insert.** {describe_event(e, token_text)}; last_access_time = {e.time:g}.")
    stale = [int(s) for s in cache.free_slots() if s < len(pool.states) and pool.states[s] == FREE_STALE]
    if stale:
        pieces = ", ".join(f"{s} ('{clean(token_text([int(pool.slot_tokens[s])]))}')" for s in stale[:8])
        lines.append(f"**Stale slots.** Free but still holding old KV until a later alloc overwrites them: {pieces}.")
    return lines


def word_groups(tokens: Sequence[str]) -> list[list[str]]:
    """Token pieces grouped into the words they spell: a piece that starts with a space (or the
    first piece) starts a word (" won", "'t" -> one word "won't")."""
    groups: list[list[str]] = []
    for t in tokens:
        if not groups or t.startswith((" ", "\n", "\t")):
            groups.append([t])
        else:
            groups[-1].append(t)
    return groups


def article_token_note(tokens: Sequence[str], cached_tokens: int, events: Sequence[Event]) -> Optional[str]:
    """Why this step's slot numbers differ from the article's, when they do: the article counts
    one token per word, this model's tokenizer splits some words in two or more. Computed from
    the step itself (its token pieces, cached count and alloc/evict events)."""
    groups = word_groups(tokens)
    split = [g for g in groups if len(g) > 1]
    if not split:
        return None
    n_cached_words, seen = 0, 0
    for g in groups:
        if seen + len(g) > cached_tokens:
            break
        seen += len(g)
        n_cached_words += 1
    new_tokens = len(tokens) - cached_tokens
    new_words = len(groups) - n_cached_words
    names = ", ".join("'" + "".join(g).strip() + "' is " + " + ".join(f"'{p}'" for p in g) for g in split)
    line = (f"**Why this differs from the article.** The article counts one token per word; this model's "
            f"tokenizer splits some words: {names}. So the prompt is {len(tokens)} tokens, not {len(groups)}, "
            f"and {new_tokens} new tokens need slots where the article needs {new_words}")
    alloc = next((e for e in events if e.kind == "alloc"), None)
    freed = [s for e in events if e.kind == "evict" for s in e.slots]
    if alloc is not None:
        article = list(alloc.slots[:new_words])
        line += f": alloc({len(alloc.slots)}) takes {slot_list(alloc.slots)} where the article's takes {slot_list(article)}"
        if freed:
            here = [s for s in freed if s not in alloc.slots]
            there = [s for s in freed if s not in article]
            line += (f", so {'only ' if len(here) < len(there) else ''}{slot_list(here) if here else 'no slot'} "
                     f"{'stays' if len(here) == 1 else 'stay'} free but stale (the article: {slot_list(there)})")
    return line + "."
