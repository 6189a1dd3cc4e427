"""Block hashes as the engines compute them, so a router that knows SGLang's (or vLLM's) hashes
recognises ours.

Our radix cache has one namespace per key, `extra_key`; the server fills it from the OpenAI
`cache_salt` field (there are no LoRA adapters here), so the publisher hashes and publishes it
as SGLang's and vLLM's `cache_salt`. (SGLang keeps two: `extra_key`, the request's extra key plus
its LoRA id, which its events hash only for LoRA namespaces, and `cache_salt`; a name alone
cannot tell a salt from an adapter.)

SGLang (sglang 0.5.23, mem_cache/cpp_utils/hash_binding.cpp, mem_cache/utils.py, events.py):
  digest(page) = sha256(prior_digest || token ids as little-endian uint32), prior_digest being
  the previous page's 32-byte digest (none for a page under the root); a page holding an id
  above 2^32-1 is hashed as sha256(prior || 0xff || ids as little-endian uint64). The event's
  block hash is the digest's first 8 bytes as a big-endian signed int64. A salted chain starts
  from prior_digest = sha256("sglang-cache-salt-v1" 0x00 || salt) (compute_node_event_hash_values).
  In the "dynamo" format every namespaced hash is also mapped through `namespaced_block_hash`:
  first 8 bytes of sha256(seed || hash as 8 signed big-endian bytes), with seed =
  sha256("sglang-kv-event-namespace-v1" || 0x00 (no extra_key) || 0x01 || len(salt) as 8 LE
  bytes || salt) (kv_event_namespace_seed).

vLLM (vllm 0.33.0, v1/core/kv_cache_utils.py hash_block_tokens, utils/hashing.py sha256):
  digest(block) = sha256(pickle((parent_digest, tuple(token_ids), extra_keys), protocol 5)),
  parent_digest of the first block = NONE_HASH = sha256(pickle("vllm-none-hash")) (or of
  $PYTHONHASHSEED when set); block hashes are published as the 32-byte digests. A salt is
  hashed as vLLM hashes a cache_salt: extra_keys = (("cache_salt", salt),) on the first block.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from typing import Optional, Sequence

import numpy as np

SCHEMES = ("sglang", "vllm")
FORMATS = ("default", "dynamo")   # SGLang's KVEventsConfig.format
_UINT32_MAX = (1 << 32) - 1
_NAMESPACE_TAG = b"sglang-kv-event-namespace-v1"
_SALT_TAG = b"sglang-cache-salt-v1\0"


def _int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def sglang_page_digest(prior: Optional[bytes], tokens: np.ndarray) -> bytes:
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > _UINT32_MAX):
        if int(tokens.min()) < 0:
            raise ValueError(f"token id {int(tokens.min())} is negative; token ids must be >= 0")
        h.update(b"\xff")
        h.update(tokens.astype("<u8").tobytes())
    else:
        h.update(tokens.astype("<u4").tobytes())
    return h.digest()


def sglang_namespace_seed(extra_key: Optional[str], cache_salt: Optional[str] = None) -> Optional[bytes]:
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(_NAMESPACE_TAG)
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
            continue
        b = part.encode("utf-8")
        h.update(b"\x01" + len(b).to_bytes(8, "little") + b)
    return h.digest()


def sglang_salt_digest(cache_salt: str) -> bytes:
    """The digest a salted chain starts from, as if it were the page before the first."""
    return hashlib.sha256(_SALT_TAG + cache_salt.encode("utf-8")).digest()


def sglang_namespaced(block_hash: int, seed: Optional[bytes]) -> int:
    if seed is None:
        return block_hash
    return _int64(hashlib.sha256(seed + block_hash.to_bytes(8, "big", signed=True)).digest())


def vllm_none_hash() -> bytes:
    seed = os.environ.get("PYTHONHASHSEED", "vllm-none-hash")
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_block_digest(parent: bytes, tokens: Sequence[int], extra_keys: Optional[tuple] = None) -> bytes:
    data = pickle.dumps((parent, tuple(int(t) for t in tokens), extra_keys), protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).digest()


class BlockHasher:
    """Hashes the pages of one radix edge given the digest its parent's last page ended with.

    `chain(prior, tokens, salt)` -> (digests, published hashes); the digests chain on to the
    children, the published hashes go into BlockStored / BlockRemoved. `prior` None means the
    pages hang under the root; `salt` is the chain's cache_salt (our key's extra_key)."""

    def __init__(self, page_size: int, scheme: str = "sglang", fmt: str = "default") -> None:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown block hash scheme {scheme!r}; choose one of: {', '.join(SCHEMES)}")
        if fmt not in FORMATS:
            raise ValueError(f"unknown event format {fmt!r}; choose one of: {', '.join(FORMATS)}")
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        self.page_size = page_size
        self.scheme = scheme
        self.fmt = fmt
        self._seeds: dict = {}
        self._none = vllm_none_hash() if scheme == "vllm" else None

    def chain(self, prior: Optional[bytes], tokens: Sequence[int],
              salt: Optional[str] = None) -> tuple[list[bytes], list]:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        ps = self.page_size
        if ids.shape[0] % ps:
            raise ValueError(f"{ids.shape[0]} tokens are not whole pages of {ps}; only whole pages are blocks")
        digests, published = [], []
        if self.scheme == "sglang":
            seed = self._seed(salt)
            if prior is None and salt is not None:
                prior = sglang_salt_digest(salt)
            for start in range(0, ids.shape[0], ps):
                prior = sglang_page_digest(prior, ids[start:start + ps])
                digests.append(prior)
                published.append(sglang_namespaced(_int64(prior), seed))
        else:
            for start in range(0, ids.shape[0], ps):
                first = prior is None
                extra = (("cache_salt", salt),) if first and salt is not None else None
                prior = vllm_block_digest(self._none if first else prior, ids[start:start + ps].tolist(), extra)
                digests.append(prior)
                published.append(prior)
        return digests, published

    def _seed(self, salt: Optional[str]) -> Optional[bytes]:
        """SGLang's namespace seed: only the dynamo format maps salted hashes through one."""
        if self.fmt != "dynamo" or salt is None:
            return None
        if salt not in self._seeds:
            self._seeds[salt] = sglang_namespace_seed(None, salt)
        return self._seeds[salt]
