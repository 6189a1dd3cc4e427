"""ForwardBatch: the new tokens of several requests, flattened, with the pool slots they read
and write, plus the index tensors and masks the attention hook needs, built once per batch and
reused by every layer (grouped extends, shared-prefix decodes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

TokenIds = Union[torch.Tensor, Sequence[int]]
Slots = Union[torch.Tensor, Sequence[int]]


def _long(x: Union[torch.Tensor, Sequence[int]], device: torch.device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.int64).reshape(-1)
    return torch.as_tensor(list(x), dtype=torch.int64, device=device).reshape(-1)


def _additive(ok: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool "may attend" -> 0 / -inf in the query's dtype. SDPA would convert a bool mask like
    this in every call; doing it once per batch saves that work in every layer."""
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, float("-inf"))


@dataclass(eq=False)
class ExtendGroup:
    """Extends attended together: queries padded to `q_len`, keys to `kv_len`."""

    rows: list[int]
    q_len: int
    kv_len: int
    q_index: torch.Tensor        # [B * q_len] flat token index of each padded query (pads repeat the last)
    kv_slots: torch.Tensor       # [B * kv_len] pool slot of each padded key (pads read slot 0, masked)
    q_pos: torch.Tensor          # [B, q_len] position of each padded query
    seq_lens: torch.Tensor       # [B] keys of each request
    valid: torch.Tensor          # [T_group] which of the B * q_len padded queries are real
    out_index: torch.Tensor      # [T_group] flat token index of each real query


# A group may cost at most this many times the attention work of its members run alone.
GROUP_PAD_FACTOR = 2.0
# Decodes whose sequences start with at least this many identical slots share them (see SharedDecodes).
MIN_SHARED_PREFIX = 32


@dataclass(eq=False)
class SharedDecodes:
    """Decodes grouped by a shared prefix: the same slots (a radix-tree path they all hit) at the
    start of every member's sequence. Attention reads each prefix once per group, as a small GEMM
    of all members' queries, instead of once per request; the per-request rest (the suffix) is
    padded. One softmax spans prefix and suffix scores together, so the result is the plain one.

    Groups are padded to `members` requests, `prefix_len` shared and `suffix_len` own keys.
    """

    num_groups: int
    members: int
    prefix_len: int
    suffix_len: int
    q_index: torch.Tensor         # [G * members] flat token index (pads repeat a member)
    prefix_slots: torch.Tensor    # [G * prefix_len] (pads read slot 0, masked)
    suffix_slots: torch.Tensor    # [G * members * suffix_len]
    prefix_ok: torch.Tensor       # [G, prefix_len] bool: real prefix keys
    suffix_ok: torch.Tensor       # [G, members, suffix_len] bool: real suffix keys
    valid: torch.Tensor           # [G * members] real members
    out_index: torch.Tensor       # [real members] flat token index


@dataclass(eq=False)
class ForwardBatch:
    """The new tokens of several requests, flattened into one sequence of batch size 1.

    Request r owns tokens `extend_starts[r] : extend_starts[r] + extend_lens[r]` of the flat
    tensors. Its sequence is `seq_slots[r]` (prefix slots, then its new slots), and token j of
    that sequence sits at position j, so a new token i has position `prefix_lens[r] + i`.
    A decode is simply a request with `extend_len == 1`.
    """

    input_ids: torch.Tensor          # [T] int64
    positions: torch.Tensor          # [T] int64
    out_slots: torch.Tensor          # [T] int64, pool slot of each new token's K/V
    seq_slots: list[torch.Tensor]    # per request, [prefix_len + extend_len] int64
    extend_lens: list[int]           # per request new-token count
    logits_indices: torch.Tensor     # [R] index of each request's last new token in the flat tensors
    prefix_lens: list[int] = field(default_factory=list)
    extend_starts: list[int] = field(default_factory=list)
    # Requests with one new token are attended together in one padded SDPA call.
    decode_rows: list[int] = field(default_factory=list)
    decode_token_idx: Optional[torch.Tensor] = None    # [Rd] flat token index of each decode
    decode_slot_table: Optional[torch.Tensor] = None   # [Rd, Lmax] slots, padded with slot 0
    decode_seq_lens: Optional[torch.Tensor] = None     # [Rd]
    decode_flat_slots: Optional[torch.Tensor] = None   # [Rd * Lmax] the table, flat, for index_select
    # Without a sliding window, decodes that share a prefix are attended as SharedDecodes and the
    # others ("plain") in one padded SDPA call over their own table.
    shared_decodes: Optional[SharedDecodes] = None
    plain_decodes: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None  # idx, flat slots, lens
    extend_rows: list[int] = field(default_factory=list)
    # Rows whose new tokens are prompt tokens (a prefill chunk, one token long included), where the caller
    # said so: a model that attends prompt tokens with another kernel than decodes (the int8 model's AMX
    # tiles) keeps a one-token chunk on the prompt kernel. Empty: no row known to be a prompt chunk.
    prompt_rows: frozenset = frozenset()
    # Extends with a cached prefix (or several fresh ones) are attended in padded groups, one SDPA
    # call per group: many small calls are slow on CPU, and very slow when its threads are contended.
    extend_groups: list[ExtendGroup] = field(default_factory=list)
    extend_singles: list[int] = field(default_factory=list)  # rows attended alone (a long fresh prefill)
    # Masks depend on the batch and the layer's window only: built once, reused by every layer.
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def num_requests(self) -> int:
        return len(self.extend_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    @classmethod
    def build(cls, requests: Sequence[tuple[TokenIds, Slots, Slots]],
              device: Union[str, torch.device] = "cpu", prompt: Optional[Sequence[bool]] = None) -> "ForwardBatch":
        """Build from `(new_token_ids, prefix_slots, new_slots)` per request.

        `prefix_slots` hold the K/V already in the pool (may be empty); `new_slots` receive
        the K/V of `new_token_ids` (same length, at least 1). Put the batch on the pool's device.
        `prompt`: per request, whether its new tokens are prompt tokens (None: rows of more than one
        token are, one-token rows are decodes).
        """
        if prompt is not None and len(prompt) != len(requests):
            raise ValueError(f"prompt has {len(prompt)} flags for {len(requests)} requests; give one per request")
        if not requests:
            raise ValueError("a ForwardBatch needs at least one request")
        device = torch.device(device)
        ids, outs, seqs, ext, pre, starts, positions = [], [], [], [], [], [], []
        start = 0
        for r, (tokens, prefix, new) in enumerate(requests):
            tokens, prefix, new = _long(tokens, device), _long(prefix, device), _long(new, device)
            if tokens.numel() == 0:
                raise ValueError(f"request {r} has no new tokens; every request in a batch computes at least one")
            if tokens.numel() != new.numel():
                raise ValueError(f"request {r} has {tokens.numel()} new tokens but {new.numel()} new slots; "
                                 f"allocate one slot per new token")
            n, p = int(tokens.numel()), int(prefix.numel())
            ids.append(tokens)
            outs.append(new)
            seqs.append(torch.cat([prefix, new]))
            ext.append(n)
            pre.append(p)
            starts.append(start)
            positions.append((p, n))
            start += n
        pos = torch.cat([torch.arange(p, p + n, dtype=torch.int64) for p, n in positions]).to(device)
        last = torch.tensor([s + n - 1 for s, n in zip(starts, ext)], dtype=torch.int64, device=device)
        batch = cls(input_ids=torch.cat(ids), positions=pos, out_slots=torch.cat(outs), seq_slots=seqs,
                    extend_lens=ext, logits_indices=last, prefix_lens=pre, extend_starts=starts)
        batch.prompt_rows = frozenset(r for r, n in enumerate(ext) if (n > 1 if prompt is None else prompt[r]))
        batch._index_decodes()
        return batch

    def _index_decodes(self) -> None:
        """Split requests into decodes (one padded call) and extends (padded groups, or alone)."""
        self.decode_rows = [r for r, n in enumerate(self.extend_lens) if n == 1]
        self.extend_rows = [r for r, n in enumerate(self.extend_lens) if n != 1]
        self._group_extends()
        if not self.decode_rows:
            return
        lens = [self.seq_slots[r].numel() for r in self.decode_rows]
        table = torch.zeros((len(lens), max(lens)), dtype=torch.int64, device=self.device)
        for i, r in enumerate(self.decode_rows):
            table[i, : lens[i]] = self.seq_slots[r]
        self.decode_slot_table = table
        self.decode_flat_slots = table.reshape(-1)
        self.decode_seq_lens = torch.tensor(lens, dtype=torch.int64, device=self.device)
        self.decode_token_idx = torch.tensor([self.extend_starts[r] for r in self.decode_rows],
                                             dtype=torch.int64, device=self.device)
        self._share_decode_prefixes(lens)

    def _share_decode_prefixes(self, lens: list[int]) -> None:
        """Find decodes whose sequences start with the same slots; see SharedDecodes."""
        by_first: dict[int, list[int]] = {}
        for i, first in enumerate(self.decode_slot_table[:, 0].tolist()):
            if lens[i] > MIN_SHARED_PREFIX:
                by_first.setdefault(first, []).append(i)
        groups: list[tuple[list[int], int]] = []
        for members in by_first.values():
            if len(members) < 2:
                continue
            sub = self.decode_slot_table[members, : min(lens[i] for i in members) - 1]  # a decode's own slot never
            same = (sub == sub[:1]).all(0).to(torch.int32).cumprod(0)                  # counts as shared
            shared = int(same.sum())
            if shared >= MIN_SHARED_PREFIX:
                groups.append((members, shared))
        if not groups:
            return
        dev = self.device
        grouped = {i for members, _ in groups for i in members}
        plain = [i for i in range(len(lens)) if i not in grouped]
        if plain:
            l_max = max(lens[i] for i in plain)
            self.plain_decodes = (self.decode_token_idx[plain], self.decode_slot_table[plain, :l_max].reshape(-1),
                                  self.decode_seq_lens[plain])
        else:
            self.plain_decodes = (self.decode_token_idx[:0], self.decode_flat_slots[:0], self.decode_seq_lens[:0])
        m_max = max(len(m) for m, _ in groups)
        p_max = max(p for _, p in groups)
        s_max = max(lens[i] - p for m, p in groups for i in m)
        ng = len(groups)
        q_index = torch.zeros((ng, m_max), dtype=torch.int64)
        prefix = torch.zeros((ng, p_max), dtype=torch.int64)
        prefix_ok = torch.zeros((ng, p_max), dtype=torch.bool)
        suffix = torch.zeros((ng, m_max, s_max), dtype=torch.int64)
        suffix_ok = torch.zeros((ng, m_max, s_max), dtype=torch.bool)
        valid = torch.zeros((ng, m_max), dtype=torch.bool)
        table = self.decode_slot_table.cpu()
        tok = self.decode_token_idx.cpu()
        for g, (members, p) in enumerate(groups):
            prefix[g, :p] = table[members[0], :p]
            prefix_ok[g, :p] = True
            q_index[g] = tok[members[0]]
            for j, i in enumerate(members):
                n = lens[i] - p
                q_index[g, j] = tok[i]
                suffix[g, j, :n] = table[i, p:lens[i]]
                suffix_ok[g, j, :n] = True
                valid[g, j] = True
        self.shared_decodes = SharedDecodes(
            num_groups=ng, members=m_max, prefix_len=p_max, suffix_len=s_max, q_index=q_index.reshape(-1).to(dev),
            prefix_slots=prefix.reshape(-1).to(dev), suffix_slots=suffix.reshape(-1).to(dev),
            prefix_ok=prefix_ok.to(dev), suffix_ok=suffix_ok.to(dev), valid=valid.reshape(-1).to(dev),
            out_index=q_index.reshape(-1)[valid.reshape(-1)].to(dev))

    def shared_masks(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Additive masks of the shared-prefix decodes: [G, 1, 1, 1, P] and [G, 1, members, 1, S]."""
        key = ("shared", dtype)
        if key not in self._masks:
            sd = self.shared_decodes
            self._masks[key] = (_additive(sd.prefix_ok, dtype)[:, None, None, None, :],
                                _additive(sd.suffix_ok, dtype)[:, None, :, None, :])
        return self._masks[key]

    def plain_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """[Rp, 1, 1, Lp] additive mask of the decodes outside any shared-prefix group."""
        key = ("plain", dtype)
        if key not in self._masks:
            idx, flat, lens = self.plain_decodes
            l_max = flat.numel() // max(1, lens.numel())
            cols = torch.arange(l_max, device=self.device)[None, :]
            self._masks[key] = _additive(cols < lens[:, None], dtype)[:, None, None, :]
        return self._masks[key]

    def _group_extends(self) -> None:
        """Pack extends into padded groups whose padding at most doubles their attention work."""
        rows = sorted(self.extend_rows, key=lambda r: (self.extend_lens[r], self.seq_slots[r].numel()))
        groups: list[list[int]] = []
        real = q_max = l_max = 0
        for r in rows:
            n, L = self.extend_lens[r], self.seq_slots[r].numel()
            if groups and (len(groups[-1]) + 1) * max(q_max, n) * max(l_max, L) \
                    <= GROUP_PAD_FACTOR * (real + n * L):
                groups[-1].append(r)
                real, q_max, l_max = real + n * L, max(q_max, n), max(l_max, L)
            else:
                groups.append([r])
                real, q_max, l_max = n * L, n, L
        for g in groups:
            if len(g) == 1:
                self.extend_singles.append(g[0])
            else:
                self.extend_groups.append(self._make_group(g))

    def _make_group(self, rows: list[int]) -> ExtendGroup:
        dev = self.device
        ns = torch.tensor([self.extend_lens[r] for r in rows], dtype=torch.int64)
        ps = torch.tensor([self.prefix_lens[r] for r in rows], dtype=torch.int64)
        starts = torch.tensor([self.extend_starts[r] for r in rows], dtype=torch.int64)
        q_len, kv_len = int(ns.max()), int((ns + ps).max())
        i = torch.arange(q_len)[None, :]
        step = torch.minimum(i, ns[:, None] - 1)           # pads repeat the request's last query
        table = torch.zeros((len(rows), kv_len), dtype=torch.int64, device=dev)
        for b, r in enumerate(rows):
            table[b, : self.seq_slots[r].numel()] = self.seq_slots[r]
        valid = (i < ns[:, None]).reshape(-1)
        q_index = (starts[:, None] + step).reshape(-1)
        return ExtendGroup(rows=rows, q_len=q_len, kv_len=kv_len, q_index=q_index.to(dev),
                           kv_slots=table.reshape(-1), q_pos=(ps[:, None] + step).to(dev),
                           seq_lens=(ns + ps).to(dev), valid=valid.to(dev), out_index=q_index[valid].to(dev))

    def group_mask(self, g: int, window: Optional[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[B, 1, q_len, kv_len] additive mask of extend group g: causal, window, padding."""
        key = ("group", g, window, dtype)
        if key not in self._masks:
            grp = self.extend_groups[g]
            k_pos = torch.arange(grp.kv_len, device=self.device)[None, None, :]
            q_pos = grp.q_pos[:, :, None]
            ok = k_pos <= q_pos   # q_pos < seq_len, so this also masks the padded keys
            if window is not None:
                ok &= k_pos > q_pos - window
            self._masks[key] = _additive(ok, dtype)[:, None]
        return self._masks[key]

    def decode_mask(self, window: Optional[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[Rd, 1, 1, Lmax] additive mask (0 or -inf): real keys of each decode, inside the window."""
        key = ("decode", window, dtype)
        if key not in self._masks:
            cols = torch.arange(self.decode_slot_table.shape[1], device=self.device)[None, :]
            lens = self.decode_seq_lens[:, None]
            mask = cols < lens
            if window is not None:
                mask &= cols > (lens - 1) - window
            self._masks[key] = _additive(mask, dtype)[:, None, None, :]
        return self._masks[key]

    def extend_mask(self, r: int, window: Optional[int]) -> Optional[torch.Tensor]:
        """[q, L] bool causal(+window) mask of request r, or None when plain `is_causal` is exact."""
        p, n = self.prefix_lens[r], self.extend_lens[r]
        if window is not None and window >= p + n:
            window = None
        if p == 0 and window is None:
            return None
        key = (r, window)
        if key not in self._masks:
            q_pos = torch.arange(p, p + n, device=self.device)[:, None]
            k_pos = torch.arange(p + n, device=self.device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
            self._masks[key] = mask
        return self._masks[key]
