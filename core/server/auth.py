"""Two roles: the inference key (`--api-key`: the OpenAI routes, reads, one's own requests) and the
admin key (`--admin-key`: flush, rebuild, step mode, everyone's prompts and requests).

    keys set          inference routes                  admin routes
    neither           open, every caller is admin       open (a loopback-only server by default)
    --api-key A       A or the admin key                only the admin key; off without --admin-key
    --admin-key B     open (anonymous callers)          only B

Several inference keys (`--api-key` given again, or RADIX_API_KEY="A,B") are tenants: each key owns its
own requests and stored responses, and its requests live in a cache namespace of its own, so a tenant
reads neither another's text nor, through cached_tokens, another's prefixes. One key keeps SGLang's
single shared cache (and its KV-event hashes).

`Authorization: Bearer KEY` is read with the scheme in any case and surrounding spaces ignored.
A caller's `identity` owns the requests it submits: only it (or the admin) may abort them or read
their tokens; keyless callers all share "anonymous", so they own nothing (EngineHost.owned). Keys
are compared in constant time and never stored or logged: identities are "admin", "anonymous" or
"key:" plus the first 12 hex digits of the key's SHA-256. With an admin key set, the admin's
requests live in a cache namespace of their own (Caller.cache_key).
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from fastapi import Request

from core.server.body_checks import RESERVED_NAMESPACE_PREFIX
from core.server.errors import APIError


@dataclass(frozen=True)
class Caller:
    admin: bool
    identity: str
    authenticated: bool     # presented a key the server knows
    namespace: Optional[str] = None   # the cache namespace all its requests live in (Keys.caller)

    @property
    def owns_requests(self) -> bool:
        """Whether requests it submits are its own: not for keyless callers, who all share "anonymous"."""
        return self.admin or self.authenticated

    def may_act_on(self, owner: Optional[str]) -> bool:
        """Whether it may read or abort what `owner` (an identity) submitted: its own, or anything for the admin."""
        return self.owns_requests and (self.admin or owner == self.identity)

    def cache_key(self, extra_key: Optional[str]) -> Optional[str]:
        """The radix cache's namespace for a request of this caller that asked for `extra_key`."""
        if self.namespace is None:
            return extra_key
        return self.namespace if extra_key is None else f"{self.namespace}/{extra_key}"


def bearer_token(header: str) -> Optional[str]:
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _same(a: str, b: str) -> bool:
    return secrets.compare_digest(a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape"))


def identity_of(key: str) -> str:
    return "key:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:12]


class Keys:
    def __init__(self, api_key: Union[str, Sequence[str], None], admin_key: Optional[str]) -> None:
        api_keys = tuple(k for k in ([api_key] if isinstance(api_key, str) else api_key or ()) if k)
        if admin_key and admin_key in api_keys:
            raise ValueError("--api-key and --admin-key must differ: the admin key is the one that can rebuild the "
                             "engine and read everyone's prompts")
        if len(set(api_keys)) != len(api_keys):
            raise ValueError("an --api-key is given twice: each inference key is one tenant; give each once")
        self.api_keys, self.admin_key = api_keys, admin_key or None
        tenants = len(api_keys) > 1
        # (key, its identity, its cache namespace): a tenant's namespace starts with the reserved prefix, so no
        # client can name it as a cache_salt
        self._api = [(k, identity_of(k), f"{RESERVED_NAMESPACE_PREFIX}{identity_of(k)}" if tenants else None)
                     for k in api_keys]
        # The admin's prompts share no cache with the inference role's: a shared prefix shows in
        # cached_tokens, so another caller could read them back a guessed token at a time. No client can
        # join it by sending it as its cache_salt (check_namespace refuses the prefix); the inference role's requests
        # stay in the namespaces they ask for, and their KV-event hashes stay SGLang's and vLLM's.
        self._admin_namespace = f"{RESERVED_NAMESPACE_PREFIX}admin:{secrets.token_hex(8)}"

    @property
    def open(self) -> bool:
        return not self.api_keys and self.admin_key is None

    def caller(self, request: Request) -> Caller:
        """Who is asking, or 401 when the inference routes need a key and none that fits was sent."""
        if self.open:
            return Caller(admin=True, identity="admin", authenticated=False)
        token = bearer_token(request.headers.get("authorization", ""))
        if token is not None and self.admin_key is not None and _same(token, self.admin_key):
            return Caller(admin=True, identity="admin", authenticated=True, namespace=self._admin_namespace)
        if token is not None:
            found = None
            for key, identity, namespace in self._api:      # every key compared: the time says only how many
                if _same(token, key):
                    found = Caller(admin=False, identity=identity, authenticated=True, namespace=namespace)
            if found is not None:
                return found
        if not self.api_keys:
            return Caller(admin=False, identity="anonymous", authenticated=False)
        raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key "
                            "the server was started with (--api-key)", code="invalid_api_key")

    def require_admin(self, caller: Caller) -> None:
        if caller.admin:
            return
        if self.admin_key is None:
            raise APIError(403, "this route changes the engine for everyone and needs the admin key, but the server "
                                "was started without one; restart it with --admin-key (RADIX_ADMIN_KEY)",
                           code="admin_key_required")
        if not caller.authenticated:
            raise APIError(401, "this route needs the admin key: send 'Authorization: Bearer <admin key>' "
                                "(--admin-key)", code="invalid_api_key")
        raise APIError(403, "this route needs the admin key (--admin-key); the inference key may only generate, "
                            "read the engine's state without prompts, and abort its own requests",
                       code="admin_key_required")

    def inference_dependency(self):
        async def inference(request: Request) -> Caller:
            caller = self.caller(request)
            request.state.caller = caller
            return caller
        return inference

    def admin_dependency(self):
        async def admin(request: Request) -> Caller:
            caller = self.caller(request)
            self.require_admin(caller)
            request.state.caller = caller
            return caller
        return admin
