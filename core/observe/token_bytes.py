"""The bytes behind each token, so text is decoded a run at a time, never a token at a time.

Byte-level BPE (GPT-2, SmolLM2, Qwen, Llama 3) splits one character over several tokens: "Ü" is
" \\xc3" + "\\x9c". Decoding each token alone turns both halves into "�", so labels made by
joining per-token pieces garble every non-ASCII character. `token_bytes` recovers each token's
raw bytes from its vocabulary string; `TokenDecoder` joins bytes first and decodes the run.
"""
from __future__ import annotations

import codecs
import re
from typing import Mapping, Optional, Sequence

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte-fallback tokens
PENDING = "·"  # a slot whose token holds only the first bytes of a character the next token ends


def _byte_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the other 68
    bytes are shifted to U+0100 upwards (so a space is "Ġ"). Returns char -> byte."""
    direct = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out = {chr(b): b for b in direct}
    shift = 0
    for b in range(256):
        if b not in out.values():
            out[chr(256 + shift)] = b
            shift += 1
    return out


BYTE_ALPHABET = _byte_alphabet()


def token_bytes(tokenizer, ids: Sequence[int]) -> list[bytes]:
    """Raw bytes of each token id: byte-fallback "<0xHH>", byte-level BPE strings, else the
    token decoded alone (SentencePiece pieces and special tokens decode cleanly on their own)."""
    ids = [int(i) for i in ids]
    names = tokenizer.convert_ids_to_tokens(ids)
    out = []
    for i, name in zip(ids, names):
        m = _BYTE_FALLBACK.fullmatch(name or "")
        if m:
            out.append(bytes([int(m.group(1), 16)]))
        elif name and all(c in BYTE_ALPHABET for c in name) and _is_byte_level(tokenizer):
            out.append(bytes(BYTE_ALPHABET[c] for c in name))
        else:
            out.append(tokenizer.decode([i]).encode("utf-8"))
    return out


_BYTE_LEVEL: dict[int, bool] = {}


def _is_byte_level(tokenizer) -> bool:
    """A byte-level BPE vocabulary spells a leading space "Ġ" (looked up once per tokenizer)."""
    key = id(tokenizer)
    if key not in _BYTE_LEVEL:
        _BYTE_LEVEL[key] = any(k.startswith("Ġ") for k in tokenizer.get_vocab())
    return _BYTE_LEVEL[key]


class TokenDecoder:
    """A `token_text` callable: joins the tokens' bytes and decodes the run as UTF-8 (ids without
    known bytes fall back to their decoded piece). `pieces` labels one token each, in context."""

    def __init__(self, pieces: Mapping[int, str], raw: Optional[Mapping[int, bytes]] = None,
                 unknown: str = "⟨{}⟩") -> None:
        self.piece_of = pieces
        self.raw = raw or {}
        self.unknown = unknown

    def _bytes(self, t: int) -> bytes:
        if t in self.raw:
            return self.raw[t]
        return (self.piece_of[t] if t in self.piece_of else self.unknown.format(t)).encode("utf-8")

    def __call__(self, token_ids: Sequence[int]) -> str:
        return b"".join(self._bytes(int(t)) for t in token_ids).decode("utf-8", errors="replace")

    def pieces(self, token_ids: Sequence[int]) -> list[str]:
        """One label per token of a run: the characters that token completes, and PENDING where it
        leaves the start of a character for the next token ("Ü" over two tokens: "·", "Ü")."""
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out = []
        for t in token_ids:
            text = dec.decode(self._bytes(int(t)))
            pending = bool(dec.getstate()[0])
            out.append(text + (PENDING if pending else ""))
        tail = dec.decode(b"", final=True)
        if tail and out:
            out[-1] = out[-1].rstrip(PENDING) + tail
        return out
