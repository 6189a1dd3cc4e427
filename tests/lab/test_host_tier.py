"""The host tier (HiCache-like): its hits equal an independent reference replay, request by request;
the optimum with the two tiers' pages bounds it; an empty host adds nothing and a host for every page
reaches the infinite rate; the time estimate is exact arithmetic on a hand-checked case."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cache.allocator import SlotAllocator
from core.cache.radix_cache import RadixCache, RadixKey
from core.lab.host_tier import WRITE_POLICIES, HostTier, replay_with_host
from core.lab.optimal import Bounds
from core.lab.page_trace import Overlap
from core.lab.replay import HOST_METHODS, replay
from core.lab.replay import HostTier as HostTierProtocol
from core.lab.units import load_model_config
from core.lab.workloads import (
    TraceRequest,
    Workload,
    few_shot,
    generated_shared_prefix,
    multi_turn_chat,
    tree_of_thought,
)


def reference(w: Workload, cap: int, host_pages: int, policy: str, ps: int, write_policy: str):
    """Sequential replay written from the engine's steps and the tier's rules (core/lab/host_tier.py's
    docstring), not from its code: the device is a RadixCache driven here directly, evicted pages are
    read off its event log and named by their whole token prefix; the host is a set and a min()."""
    alloc = SlotAllocator(cap - cap % ps, page_size=ps)
    cache = RadixCache(alloc, page_size=ps, eviction_policy=policy, record_events=True, event_capacity=10 ** 6)
    host: set = set()
    last: dict = {}
    uses: dict = {}
    on_dev: set = set()
    t = 0
    out = []

    def write(p):
        if p in host or host_pages == 0:
            return
        if len(host) >= host_pages:
            free = [q for q in host if q not in on_dev]
            if not free:
                return
            victim = min(free, key=lambda q: last[q])
            if last[victim] > last[p]:
                return
            host.discard(victim)
        host.add(p)

    def use(p):
        uses[p] = uses.get(p, 0) + 1
        if write_policy == "write_through_selective" and uses[p] >= 2:
            write(p)

    def full_prefixes():
        pre = {}
        for n in cache.nodes():
            toks, m = [], n
            while m is not None and m is not cache.root_node:
                toks[:0] = m.key.token_ids.tolist()
                m = m.parent
            pre[n.id] = (n.key.extra_key, tuple(toks), len(n.key))
        return pre

    def get_slots(n):
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        s = alloc.alloc(n)
        if s is None:
            pre, seq = full_prefixes(), cache.events.last_seq
            cache.evict(n - alloc.available())
            for ev in cache.events.since(seq):
                if ev.kind == "evict":
                    extra, toks, k = pre[ev.node]
                    for end in range(len(toks) - k + ps, len(toks) + 1, ps):
                        p = (extra, toks[:end])
                        if write_policy == "write_back":
                            write(p)
                        on_dev.discard(p)
            s = alloc.alloc(n)
        return s

    def place(r, seq, lo, hi):
        nonlocal t
        if hi <= lo:
            return
        t += 1
        for k in range(lo // ps, hi // ps):
            p = (r.extra_key, tuple(seq[:(k + 1) * ps].tolist()))
            on_dev.add(p)
            last[p] = (t, -k)
            use(p)
            if write_policy == "write_through":
                write(p)

    for r in w.requests:
        cache.tick()
        t += 1
        seq = r.cached_ids()
        n_prompt = r.prompt_len - r.prompt_len % ps
        n_match = (r.prompt_len - 1) // ps * ps           # never the prompt's last token: the engine computes it
        n_cached = r.cached_len - r.cached_len % ps
        page = (lambda k: (r.extra_key, tuple(seq[:(k + 1) * ps].tolist())))
        m = cache.match_prefix(RadixKey(seq[:n_match], r.extra_key))
        hit = int(m.indices.numel())
        for k in range(hit // ps):
            last[page(k)] = (t, -k)
            use(page(k))
        j, loaded = hit // ps, []
        while j < n_match // ps and page(j) in host and page(j) not in on_dev:
            last[page(j)] = (t, -j)
            on_dev.add(page(j))
            loaded.append(page(j))
            j += 1
        cache.inc_lock_ref(m.last_node)
        slots = get_slots(-(-r.cached_len // ps) * ps - hit)
        if slots is None:
            cache.dec_lock_ref(m.last_node)
            on_dev.difference_update(loaded)
            out.append((0, 0))
            cache.tick()
            continue
        out.append((hit, len(loaded) * ps))
        value = torch.cat([m.indices, slots])
        inserted = 0                 # the request's inserted length: a node counts its hit once (SGLang)
        if n_prompt > hit:
            done = cache.insert(RadixKey(seq[:n_prompt], r.extra_key), value[:n_prompt])
            inserted = n_prompt
            place(r, seq, done, n_prompt)
            alloc.free(value[hit:done]) if done > hit else None
            m2 = cache.match_prefix(RadixKey(seq[:n_prompt], r.extra_key))
            cache.inc_lock_ref(m2.last_node)
            cache.dec_lock_ref(m.last_node)
            m = m2
            value = torch.cat([m.indices, value[n_prompt:]])
        in_tree = int(m.indices.numel())
        if n_cached > 0:             # even when it adds nothing: it stamps the path and counts hits
            done = cache.insert(RadixKey(seq[:n_cached], r.extra_key), value[:n_cached], inserted_len=inserted)
            place(r, seq, done, n_cached)
            alloc.free(value[in_tree:done]) if done > in_tree else None
        tail = value[max(n_cached, in_tree):]
        if tail.numel():
            alloc.free(tail)
        cache.dec_lock_ref(m.last_node)
        cache.tick()
    return out


def workloads():
    return [
        generated_shared_prefix(num_groups=6, prompts_per_group=4, system_prompt_len=48, question_len=8,
                                output_len=6, order="shuffled", seed=3),
        multi_turn_chat(num_sessions=4, turns=4, system_prompt_len=20, user_len=6, output_len=10, seed=2),
        few_shot(num_requests=30, num_tasks=4, examples_len=40, question_len=6, output_len=4, seed=1),
        tree_of_thought(num_problems=2, branching=2, depth=3, problem_len=30, step_len=3, thought_len=8, seed=4),
    ]


@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
@pytest.mark.parametrize("ps", [1, 4])
def test_host_hits_equal_an_independent_reference_request_by_request(write_policy, ps):
    checked = 0
    for w in workloads():
        longest = max(-(-r.cached_len // ps) * ps for r in w.requests)
        for (device, host), policy in zip(((longest, 64 * ps), (longest + 24 * ps, 160 * ps), (2 * longest, 0),
                                           (longest + 8 * ps, 32 * ps)), ("lru", "lfu", "fifo", "lru")):
            got = replay_with_host(w, device, host, policy, ps, write_policy=write_policy)
            want = reference(w, device, host // ps, policy, ps, write_policy)
            assert list(zip(got.device_hits.tolist(), got.host_hits.tolist())) == want, (w.name, device, host, policy)
            assert got.device_hit_tokens == replay(w, device, policy, ps).hit_tokens   # the device is unchanged
            checked += got.host_hit_tokens
    assert checked > 100        # the host tier did hit on these workloads


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("overlap", [None, Overlap(ms_per_output_token=15.0)], ids=["sequential", "overlap"])
def test_optimum_with_both_tiers_pages_bounds_device_plus_host(ps, overlap):
    for w in workloads():
        if overlap is not None:
            for i, r in enumerate(w.requests):      # the same requests (fresh output ids too), now timed
                r.timestamp = 10.0 * i
        b = Bounds(w, ps, overlap)
        longest = max(-(-r.cached_len // ps) * ps for r in w.requests)
        for device, host in ((longest, 8 * ps), (longest + 16 * ps, 32 * ps), (longest, 200 * ps)):
            opt = b.optimal(device + host).hit_tokens
            for wp in WRITE_POLICIES:
                for policy in ("lru", "slru", "mru"):
                    r = replay_with_host(w, device, host, policy, ps, overlap, wp)
                    assert r.device_hit_tokens + r.host_hit_tokens <= opt, (w.name, device, host, wp, policy)
                    assert r.miss_tokens == w.prompt_tokens - r.device_hit_tokens - r.host_hit_tokens >= 0


@st.composite
def small_workloads(draw):
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        prompt = draw(st.lists(st.integers(0, 3), min_size=1, max_size=14))
        out = draw(st.lists(st.integers(0, 3), min_size=1, max_size=5))
        reqs.append(TraceRequest(prompt, output=out, timestamp=float(draw(st.integers(0, 40))) + 10 * i))
    return Workload("small", reqs)


@settings(max_examples=60, deadline=None)
@given(small_workloads(), st.integers(1, 10), st.integers(0, 10), st.sampled_from(WRITE_POLICIES),
       st.sampled_from([1, 2, 4]), st.booleans())
def test_property_two_tiers_never_beat_the_optimum_of_their_pages(w, dev_pages, host_pages, wp, ps, overlap):
    ov = Overlap(ms_per_output_token=4.0) if overlap else None
    r = replay_with_host(w, dev_pages * ps, host_pages * ps, "lru", ps, ov, wp, check_invariants=True)
    assert r.device_hit_tokens + r.host_hit_tokens <= Bounds(w, ps, ov).optimal((dev_pages + host_pages) * ps).hit_tokens
    if not overlap:
        assert r.device_hits.tolist() == [a for a, _ in reference(w, dev_pages * ps, host_pages, "lru", ps, wp)]


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_a_host_for_every_page_reaches_the_infinite_rate_and_an_empty_one_adds_nothing(write_policy):
    for w in workloads():
        for ps in (1, 4):
            b = Bounds(w, ps)
            device = max(-(-r.cached_len // ps) * ps for r in w.requests)
            full = replay_with_host(w, device, b.distinct_pages * ps, "lru", ps, write_policy=write_policy)
            assert full.device_hit_tokens + full.host_hit_tokens == b.infinite().hit_tokens, (w.name, ps)
            empty = replay_with_host(w, device, 0, "lru", ps, write_policy=write_policy)
            assert empty.host_hit_tokens == 0 and empty.host_writes == 0
            assert empty.device_hit_tokens == replay(w, device, "lru", ps).hit_tokens


def test_two_requests_one_prefix_evicted_to_host_then_loaded_back():
    """A (40 tokens) then B (a different 40) then A again, in a device pool of one request: A's prompt
    goes to host when B evicts it (write-back) and comes back as a host hit of 40 tokens."""
    a, b = list(range(40)), list(range(100, 140))
    w = Workload("aba", [TraceRequest(a, output=[7]), TraceRequest(b, output=[8]), TraceRequest(a + [1], output=[9])])
    r = replay_with_host(w, 48, 64, "lru", 1, write_policy="write_back", check_invariants=True)
    assert r.device_hits.tolist() == [0, 0, 0] and r.host_hits.tolist() == [0, 0, 40]
    assert r.summary()["miss_tokens"] == 40 + 40 + 1
    kv = load_model_config("llama-3.1-8b")
    t = r.ttft(kv, prefill_tokens_per_s=1000.0, bandwidth_gbps=10.0)
    load = 40 * 131_072 / 10e9
    assert t["prefill_seconds_device_only"] == pytest.approx((40 + 40 + 41) / 1000)
    assert t["prefill_seconds_with_host"] == pytest.approx((40 + 40 + 1) / 1000 + load)
    assert t["prefill_seconds_saved"] == pytest.approx(40 / 1000 - load)
    assert t["ttft_p50_device_only"] == pytest.approx(0.040) and t["ttft_p50_with_host"] == pytest.approx(0.040)
    assert t["ttft_p99_with_host"] == pytest.approx(np.percentile([0.040, 0.040, 0.001 + load], 99))
    assert replay_with_host(w, 48, 64, "lru", 1, write_policy="write_through_selective").host_hit_tokens == 0


def test_the_tier_is_the_replays_seam():
    """HostTier implements the page-level replay's Protocol, method for method and argument for argument."""
    import inspect
    for m in HOST_METHODS:
        want = list(inspect.signature(getattr(HostTierProtocol, m)).parameters)
        assert list(inspect.signature(getattr(HostTier, m)).parameters) == want, m


def test_bad_input():
    w = few_shot(num_requests=3, examples_len=10, question_len=2)
    with pytest.raises(ValueError, match="unknown host write policy 'sometimes'; choose one of: write_through"):
        replay_with_host(w, 64, 64, write_policy="sometimes")
    for bad in (-1, 1.5, None, True):
        with pytest.raises(ValueError, match="host capacity must be a whole number of tokens"):
            replay_with_host(w, 64, bad)
    r = replay_with_host(w, 64, 64)
    with pytest.raises(ValueError, match="prefill rate must be a positive number"):
        r.ttft(load_model_config("qwen2.5-7b"), prefill_tokens_per_s=float("nan"))
    with pytest.raises(ValueError, match="host bandwidth must be a positive number"):
        r.ttft(load_model_config("qwen2.5-7b"), bandwidth_gbps=0)


@pytest.mark.parametrize("policy", ["arc", "s3fifo", "recall"])
def test_a_stateful_policy_gets_a_host_tier_only_where_the_page_level_replay_is_exact(policy):
    """By page, a stateful policy's ghosts are not the engine's: its device hits there differed from the sweep's
    own at the same pool. At page size 1 the page level is the token level, so the device side is the sweep's."""
    w = workloads()[0]
    with pytest.raises(ValueError, match=f"no host-tier replay for {policy} at page size 4: .* use --page-size 1"):
        replay_with_host(w, 64, 64, policy, 4)
    for cap in (24, 48, 96):
        r = replay_with_host(w, cap, 64, policy, 1)
        assert r.device_hit_tokens == replay(w, cap, policy, 1).hit_tokens


def test_time_to_first_token_is_none_when_no_request_was_served():
    w = few_shot(num_requests=3, examples_len=10, question_len=2)
    t = replay_with_host(w, 4, 64).ttft(load_model_config("qwen2.5-7b"))
    assert t["requests"] == 0
    assert [t[k] for k in t if k.startswith("ttft_")] == [None] * 4    # not 0 s, the best latency there is


@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
def test_one_tier_object_serves_several_replays_each_starting_empty(write_policy):
    """A sweep may pass one HostTier to every point: each replay starts with an empty host (begin()), so
    every point equals a fresh tier's, and an earlier point's counts are not overwritten by a later one."""
    w = workloads()[0]
    ps = 4
    longest = max(-(-r.cached_len // ps) * ps for r in w.requests)
    tier = HostTier(w, ps, 64, write_policy)
    got = []
    for device in (longest + 8 * ps, longest + 40 * ps, longest + 8 * ps):
        replay(w, device, "lru", ps, level="page", host=tier)
        got.append((device, tier.device_hits, tier.host_hits, tier.writes))
    for device, dev_hits, host_hits, writes in got:
        fresh = HostTier(w, ps, 64, write_policy)
        replay(w, device, "lru", ps, level="page", host=fresh)
        assert dev_hits.tolist() == fresh.device_hits.tolist() and host_hits.tolist() == fresh.host_hits.tolist()
        assert writes == fresh.writes
    assert got[0][2].sum() > 0 and got[0][2] is not got[2][2]     # the tier hit; each replay has its own arrays
    with pytest.raises(ValueError, match="counts 24 requests but the workload has 3; make a HostTier for each"):
        replay(few_shot(num_requests=3, examples_len=10, question_len=2), 64, "lru", ps, level="page", host=tier)
