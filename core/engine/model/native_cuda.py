"""CUDA graphs for the native decode step: on by default on CUDA (EngineConfig.disable_cuda_graph turns them off).
Measured on an H200 (benchmarks/README.md, "On a GPU"): batch-1 decode 217 tok/s against 48 eager; greedy tokens
equal the eager engine's and HF generate's (tests/engine/model/test_native_cuda.py, run by scripts/gpu_check.sh).

Design: `NativeLlama.decode_step_fn()` is a pure torch function of static-shaped tensors (no host
sync, no Python branch on data), so one graph per (batch bucket, context bucket) can be captured
and replayed. Each graph owns static input buffers; a step copies the batch into them (padding
rows decode token 0 at position 0 into slot 0, the pool's padding slot, attending slot 0 only),
replays, and returns the first R rows of the static logits. Graphs bake in the pool's buffer
addresses, so a decoder belongs to one KVPool. Contexts are padded up to a bucket: the step reads
`bucket` slots per request (masked), so buckets trade capture count against wasted reads; a
paged-attention kernel (FlashInfer, vLLM) reading only `lens[r]` slots would remove that waste and
is the natural next step on a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch

from core.engine.model.forward_batch import ForwardBatch
from core.cache.kv_pool import KVPool

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
CONTEXT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class _Graph:
    def __init__(self, step, pool: KVPool, batch: int, ctx: int, mempool) -> None:
        dev = pool.device
        self.ids = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.out_slots = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.slots = torch.zeros((batch, ctx), dtype=torch.int64, device=dev)
        self.lens = torch.ones(batch, dtype=torch.int64, device=dev)
        args = (self.ids, self.pos, self.out_slots, self.slots, self.lens, pool.k_buffer, pool.v_buffer)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(side):
            for _ in range(2):      # warm up: lazy inits and autotuning happen outside the capture
                step(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph, pool=mempool):
            self.logits = step(*args)

    def run(self, batch: ForwardBatch) -> torch.Tensor:
        r = batch.num_requests
        table, lens = batch.decode_slot_table, batch.decode_seq_lens
        self.ids.zero_()
        self.ids[:r].copy_(batch.input_ids)
        self.pos.zero_()
        self.pos[:r].copy_(batch.positions)
        self.out_slots.zero_()
        self.out_slots[:r].copy_(batch.out_slots)
        self.slots.zero_()
        self.slots[:r, : table.shape[1]].copy_(table)
        self.lens.fill_(1)
        self.lens[:r].copy_(lens)
        self.graph.replay()
        return self.logits[:r].clone()


class CudaGraphDecoder:
    """Replays captured decode steps for pure-decode batches that fit a bucket; None otherwise."""

    def __init__(self, native, pool: KVPool, batch_sizes=BATCH_SIZES, context_buckets=CONTEXT_BUCKETS) -> None:
        if pool.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA pool")
        self.native, self.pool = native, pool
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.context_buckets = tuple(sorted(b for b in context_buckets if b <= native.max_positions)) \
            or (native.max_positions,)
        self.step = native.decode_step_fn(attention="sdpa")
        self.mempool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], _Graph] = {}

    def _bucket(self, values: tuple[int, ...], n: int) -> Optional[int]:
        return next((v for v in values if v >= n), None)

    def try_run(self, batch: ForwardBatch) -> Optional[torch.Tensor]:
        if batch.extend_rows or not batch.decode_rows:
            return None
        b = self._bucket(self.batch_sizes, batch.num_requests)
        c = self._bucket(self.context_buckets, int(batch.decode_slot_table.shape[1]))
        if b is None or c is None:
            return None
        key = (b, c)
        if key not in self.graphs:
            self.graphs[key] = _Graph(self.step, self.pool, b, c, self.mempool)
        return self.graphs[key].run(batch)
