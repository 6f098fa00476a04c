"""Persistent stream-K NVFP4 W4A16 GEMM and the tuned dispatch, on top of the example module.

The example's kernels give each CTA a whole output tile (or a fixed 1/split_k of its K range).
When the tiles do not divide evenly over the SMs, the last wave leaves SMs idle. The stream-K kernel
launches ``G = SMs * ctas_per_sm`` persistent CTAs and gives each a contiguous, equal range of the
flattened (tile, k tile) iteration space, so every SM streams the same number of weight bytes.
A tile cut between CTAs is reduced deterministically: each piece goes to an FP32 partial slot, and
the last piece to arrive (an atomic ticket) sums the slots in CTA order and resets the ticket.

Everything else is the example's: the prepared layout, the register dequant, the warp-level MMA
(``WarpTile``), the input checks and the chunking. This module adds:

1. ``StreamKConfig`` and the stream-K kernel (a hand-written cp.async stage loader: ``T.Pipelined``
   cannot express a loop whose k range is known only at run time);
2. the stream-K heuristic, which falls back to the example's heuristic when the ranges are short,
   and on sm_90 the Hopper wgmma kernel's heuristic (``maint/gemm/gemm_sm90``) before both;
3. tuned tables keyed by the GPU (compute capability and SM count), stored as JSON beside this file;
4. ``nvfp4_w4a16_linear``: the example's signature, consulting the tuned table first.
"""

import functools
import json
import math
import pathlib
import sys
from typing import NamedTuple, Optional, Union

import torch

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[2] / "examples" / "gemm_sm120"))

sys.path.insert(0, str(_HERE.parents[0] / "gemm_sm90"))

import sm120_nvfp4_w4a16_gemm as example  # noqa: E402
import sm120_nvfp4_w4a16_skinny as skinny  # noqa: E402
import sm90_nvfp4_w4a16_wgmma as hopper  # noqa: E402
from sm120_nvfp4_w4a16_skinny import SkinnyConfig  # noqa: E402
from sm120_nvfp4_w4a16_gemm import (  # noqa: E402,F401  (re-exported: one import gives the whole surface)
    FragConfig,
    NVFP4W4A16Weight,
    TileConfig,
    prepare_nvfp4_weight,
)

# ----------------------------------------------------------------------------------------------
# 1. The stream-K kernel
# ----------------------------------------------------------------------------------------------


@example.config_type
class StreamKConfig(NamedTuple):
    """Persistent stream-K: ``ctas_per_sm`` CTAs per SM, each with a ``block_m x block_n`` tile
    shape over a ``warps_m x warps_n`` warp grid, streaming ``stages`` cp.async stages of ``block_k``."""

    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    warps_m: int = 1
    warps_n: int = 4
    stages: int = 4
    ctas_per_sm: int = 1

    def kernel_shape(self) -> example.KernelShape:
        return example.KernelShape(self.block_m, self.block_n, self.block_k, self.warps_m, self.warps_n, self.stages, 1)


@example.config_type
class WgmmaStreamKConfig(NamedTuple):
    """Stream-K over the wgmma kernel (sm_90 only): ``ctas_per_sm`` persistent CTAs per SM, each
    running ``hopper.wgmma_pipeline`` segments of ``block_x``-row x blocks and 128 weight rows.
    ``producer`` as in ``hopper.WgmmaConfig``. ``streamk_waves`` = 0 cuts the whole (tile, k tile)
    space into equal ranges; ``w`` >= 1 cuts only the tiles left over by whole waves plus ``w - 1``
    waves (``streamk_tiles``): the CTAs share those first, then take the rest whole, one per CTA per
    wave. ``a_batches`` as in ``hopper.WgmmaConfig``: two batches per 128-deep k tile take one
    warpgroup's A registers from 128 to 64 per thread, which lets two CTAs per SM take a producer
    warpgroup without ptxas serializing their wgmmas. H200, 2026-12-03 (34816x5120, one warpgroup,
    6 stages, 2 CTAs per SM; results/h200_ab_2026-12-03i_a_batches.json), against one batch and no
    producer: with the producer M = 24 35.4 us against 37.0 and M = 32 37.1 against 38.0; without
    it 37.0 and 38.6 (the per-k-tile CTA barrier stays); four batches lost with or without it
    (39.1-45.5 at M = 32: a wgmma wait per k32 block). The batches alone, at three CTAs per SM
    (the forty-second session's ``batch_k``), had lost 2-7 % and were dropped."""

    block_x: int = 128
    block_k: int = hopper.SWIZZLE_K
    stages: int = 4
    ctas_per_sm: int = 2
    tma_loads: bool = False
    warpgroups: int = 1
    producer: bool = False
    streamk_waves: int = 0
    a_batches: int = 1
    scale_pairs: bool = False

    SHARED_BYTES_PER_CTA = hopper.SM90_SMEM_PER_CTA
    FIELD_MINIMUMS = {"streamk_waves": 0}  # 0: plain stream-K
    MAX_ACCUMULATORS = hopper.WgmmaConfig.MAX_ACCUMULATORS
    BLOCK_M_STEP = property(lambda self: self.segment_config().BLOCK_M_STEP)  # as the wgmma kernel's

    def segment_config(self) -> hopper.WgmmaConfig:
        """The wgmma kernel config whose pipeline each segment runs (split-K does not apply)."""
        return hopper.WgmmaConfig(
            self.block_x, self.block_k, self.stages, 1, self.tma_loads, self.warpgroups, self.producer,
            a_batches=self.a_batches, scale_pairs=self.scale_pairs,
        )  # fmt: skip

    def kernel_shape(self) -> example.KernelShape:
        return self.segment_config().kernel_shape()


# The wgmma configs (maint/gemm/gemm_sm90) run on sm_90 only: explicit configs, sm_90 tables and
# the sm_90 branch of heuristic_config name them, so sm_120 never sees them.
AnyConfig = Union[FragConfig, TileConfig, StreamKConfig, hopper.WgmmaConfig, WgmmaStreamKConfig, SkinnyConfig]
CONFIG_TYPES = (FragConfig, TileConfig, StreamKConfig, hopper.WgmmaConfig, WgmmaStreamKConfig, SkinnyConfig)
COPIES_PER_STAGE = 3  # commit groups per stage: x (by hand), codes and scales (T.async_copy commits each)
x_swizzled = hopper.x_swizzled  # the x tiles are laid out and loaded as the wgmma kernel's
PARTIAL_SLOTS_PER_CTA = 2  # a CTA's range cuts at most two tiles: its first and its last
MAX_CTAS_PER_SM = 4


def smem_per_sm(arch: str) -> int:
    """Shared memory one SM offers its CTAs: 228 KB on sm_90, 100 KB on sm_120 (and as the default)."""
    return hopper.SM90_SMEM_PER_SM if arch.startswith("sm_90") else example.SM120_SMEM_PER_SM


def check_streamk_config(config: StreamKConfig, n: int, k: int, smem_per_sm: int = example.SM120_SMEM_PER_SM) -> None:
    """The example's shape and shared-memory checks, plus the stream-K fields: ``ctas_per_sm``
    CTAs must fit one SM together (``smem_per_sm``: sm_120's 100 KB unless an sm_90 table says so),
    each with the driver's reserve."""
    example.check_config(config, n, k, CONFIG_TYPES)
    if not 1 <= config.ctas_per_sm <= MAX_CTAS_PER_SM:
        raise ValueError(f"config {config}: ctas_per_sm must be 1..{MAX_CTAS_PER_SM}")
    if config.ctas_per_sm * (config.kernel_shape().shared_bytes() + hopper.CTA_RESERVED_SMEM) > smem_per_sm:
        raise ValueError(f"config {config}: {config.ctas_per_sm} CTAs need more than {smem_per_sm} bytes of shared memory per SM")


def streamk_range(g, iterations, grid):
    """CTA ``g``'s iterations ``[begin, end)``: equal shares of the flattened (tile, k tile) space.
    Works on ints and on TileLang expressions alike (the kernel and the tests use the same code)."""
    return g * iterations // grid, (g + 1) * iterations // grid


def streamk_grid(sm_count: int, ctas_per_sm: int, iterations: int) -> int:
    """``SMs * ctas_per_sm`` CTAs, but never more than iterations: every range is then non-empty,
    so the CTAs holding pieces of one tile are consecutive and the reducer can count them."""
    return max(1, min(sm_count * ctas_per_sm, iterations))


def streamk_cta_of(i, iterations, grid):
    """The CTA whose range holds iteration ``i``: the g with g I / G <= i < (g + 1) I / G."""
    return ((i + 1) * grid - 1) // iterations


# Stream-K with whole tiles after it (``WgmmaStreamKConfig.streamk_waves``). Plain stream-K cuts
# nearly every CTA's range inside tiles, so the CTAs run at scattered k positions of their tiles, and
# each cut costs a partial's round trip. With whole waves the CTAs run in step (the tiles of one wave
# share x blocks and weight tiles through L2) and only the stream-K share is cut. That share comes
# first, so that its sums happen while the waves run: the tiles left over by the whole waves, plus
# ``streamk_waves - 1`` waves. One left-over tile cut over many CTAs costs its summing CTA a read of
# every other piece, and a wave more in the share gives each tile at most two pieces; which one wins
# depends on the shape (H200, 2026-11-30: 5120x17408 M = 1024, 160 tiles on 132 CTAs, 231.6 us with
# 28 shared against 249.5 plain; 34816x5120 M = 1024, 1088 tiles, 449.8 with 164 shared against 465.8
# with 32 and 468.5 plain), so the tuner offers both.


def streamk_tiles(tiles: int, k_tiles: int, grid: int, streamk_waves: int) -> int:
    """The tiles the CTAs share as stream-K (tiles ``[0, S)``); the rest run whole, tile ``S + g + j *
    grid`` on CTA ``g`` in wave ``j``. All of them with ``streamk_waves`` = 0 or under one wave. A
    wave more where the share would leave a CTA without an iteration."""
    if not streamk_waves or tiles < grid:
        return tiles
    shared = tiles % grid + (streamk_waves - 1) * grid
    if 0 < shared * k_tiles < grid:
        shared += grid
    return min(shared, tiles)


def wgmma_streamk_share(m: int, n: int, k: int, config: "WgmmaStreamKConfig", sm_count: int) -> tuple:
    """``(tiles, S)``: the output tiles of stream-K over the wgmma kernel at M = ``m`` and how many of
    them its CTAs share (``streamk_tiles``), as ``launch_wgmma_streamk`` runs it on ``sm_count`` SMs."""
    tiles, k_tiles = hopper._tiles(m, n, config.block_x), k // config.block_k
    grid = streamk_grid(sm_count, config.ctas_per_sm, tiles * k_tiles)
    return tiles, streamk_tiles(tiles, k_tiles, grid, config.streamk_waves)


def streamk_segments(phase, g, begin, end, tiles, sk_tiles, grid, k_tiles, select):
    """CTA ``g``'s segments in ``phase`` 0, the tiles its stream-K range ``[begin, end)`` touches,
    and phase 1 (``streamk_waves``), its whole tiles, one per wave: the loop ``[start, stop)`` over
    them. ``select(c, a, b)`` is ``a if c else b`` (``T.if_then_else`` in the kernel, where ``phase``
    is an unrolled loop's variable); ints and TileLang expressions alike, as ``streamk_range``."""
    whole = (tiles - sk_tiles - g + grid - 1) // grid  # 0 for the CTAs the last wave leaves out
    return select(phase == 0, begin // k_tiles, 0), select(phase == 0, (end - 1) // k_tiles + 1, whole)


def streamk_segment(phase, s, begin, end, g, sk_tiles, grid, k_tiles, select):
    """Segment ``s`` of ``streamk_segments``' loop as ``(tile, lo, hi)``: the tile and the iterations
    it is clipped to."""
    whole = sk_tiles + g + s * grid
    return select(phase == 0, s, whole), select(phase == 0, begin, whole * k_tiles), select(phase == 0, end, whole * k_tiles + k_tiles)


# A tile's ticket counts its pieces' CTAs twice: as they arrive (ARRIVED each, the low half) and as
# they finish writing their piece (WRITTEN each, the high half). The last to arrive keeps its piece in
# registers where it can: it waits until the others' pieces are written and sums them with its own.
# A CTA waiting at a ticket waits only for CTAs that have already arrived there, which are running and
# about to write: nothing depends on a CTA that has not started (no co-residency assumption, unlike a
# reducer fixed in advance). Before, every piece went through memory, the summing CTA's too: with two
# pieces per tile, twice the partial traffic; cutting tiles cost 5-15 % against whole tiles with the
# same config (H200, 2026-11-30s, results/h200_timings_2026-11-30s_whole_tile_grid.json). With the
# last piece kept in registers, the 14 stream-K cells of the H200 table timed ran 0.92-0.98x their
# time before (2026-11-30u, results/h200_timings_2026-11-30u_fixup_in_registers.json).
ARRIVED = 1
WRITTEN = 1 << 16  # a tile has at most grid <= 65535 pieces


def streamk_fixup(acc_size: int, threads: int, k_tiles: int, sync=None):
    """The deterministic reduction of an output tile cut between stream-K CTAs, as a macro:
    ``fixup(acc, partials, tickets, ticket, g, tile, iterations, grid, tx, store)``.

    CTA ``g`` arrives at ``tile``'s ticket (see ARRIVED).
    The others write their piece ``acc`` to their partial slot 0 (their first tile) or 1 (their
    last), in the example's fragment order (``partial_slots``). The last to arrive sums the pieces
    as ``p_first + p_first+1 + ...`` in CTA order, so the result does not depend on arrival order:
    its own piece from registers where it is the first or the second (IEEE addition commutes), else
    through its slot. It hands the sum to ``store(acc)`` (a Python callable that emits the store) and
    resets the ticket for the next launch. Mostly the first piece's CTA arrives last: the other pieces
    open their CTAs' ranges, the first closes its CTA's. ``threads`` threads hold the pieces;
    ``sync()`` emits their barrier (by default the whole CTA's; see ``hopper.consumer_sync`` for a
    CTA with a producer warpgroup).
    """
    import tilelang.language as T

    sync = sync or T.sync_threads
    slots = example.partial_slots(acc_size, threads)

    def slot_of(c, tile_begin, iterations, grid):  # slot 0: a CTA's first tile, slot 1: its last
        return c * PARTIAL_SLOTS_PER_CTA + T.if_then_else(streamk_range(c, iterations, grid)[0] >= tile_begin, 0, 1)

    @T.macro
    def fixup(acc, partials, tickets, ticket, g, tile, iterations, grid, tx, store):
        tile_begin = tile * k_tiles
        # CTAs holding a piece of this tile: those whose ranges hold its first and last iterations.
        first_cta = streamk_cta_of(tile_begin, iterations, grid)
        last_cta = streamk_cta_of(tile_begin + k_tiles - 1, iterations, grid)
        if tx == 0:
            ticket[0] = T.atomic_add(tickets[tile], ARRIVED, return_prev=True) % WRITTEN
        sync()
        if ticket[0] == last_cta - first_cta:
            if g > first_cta + 1:  # a third piece or later: its place in the sum is behind two loaded ones
                slots.store(acc, partials, slot_of(g, tile_begin, iterations, grid), tx)
            if tx == 0:
                while T.atomic_load(tickets[tile], memory_order="acquire") // WRITTEN < last_cta - first_cta:
                    T.evaluate(0)
            sync()  # after thread 0's acquire: the pieces written before each WRITTEN release are visible
            if g == first_cta + 1:
                slots.add(acc, partials, slot_of(first_cta, tile_begin, iterations, grid), tx)
            elif g > first_cta + 1:
                slots.load(acc, partials, slot_of(first_cta, tile_begin, iterations, grid), tx)
                for c in T.serial(first_cta + 1, g + 1):
                    slots.add(acc, partials, slot_of(c, tile_begin, iterations, grid), tx)
            for c in T.serial(g + 1, last_cta + 1):  # acc holds the pieces up to g's: the rest in order
                slots.add(acc, partials, slot_of(c, tile_begin, iterations, grid), tx)
            store(acc)
            if tx == 0:
                tickets[tile] = 0
        else:
            slots.store(acc, partials, slot_of(g, tile_begin, iterations, grid), tx)
            sync()
            if tx == 0:  # release (cumulative): the CTA's piece, ordered before it by the barrier
                T.atomic_add(tickets[tile], WRITTEN, memory_order="release")

    return fixup


def build_streamk_kernel(n: int, k: int, shape: example.KernelShape, assume_positive_grid: bool = True):
    """The stream-K kernel for an ``N x K`` weight; the grid size ``G`` is a run-time scalar.

    Iteration ``i`` of the flattened space is k tile ``i % KT`` of tile ``i // KT``; tile ``t`` is row
    block ``t % tiles_m`` of column block ``t // tiles_m`` (neighbouring tiles share weights, which
    then come from L2). CTA ``g`` runs iterations ``[g I / G, (g + 1) I / G)``.
    ``assume_positive_grid`` adds ``T.assume(G > 0)``; without it every floor division by ``G``
    carries sign fix-ups (kept switchable so the difference can be measured).
    """
    import tilelang.language as T

    bm_, bn_, bk_, stages = shape.block_m, shape.block_n, shape.block_k, shape.stages
    threads = shape.threads
    k_tiles = k // bk_
    tiles_n = n // bn_
    wt = example.warp_tile(shape)
    load_x = hopper.x_tile_loader(bm_, bk_, threads)
    fixup = streamk_fixup(wt.acc_size, threads, k_tiles)

    @T.macro
    def load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, it, stage, tiles_m, m, tx):
        """cp.async of iteration ``it``'s x, code and scale tiles into ``stage``; x rows at or past
        ``m`` are zero-filled (a predicated cp.async reads nothing)."""
        tile, kt = it // k_tiles, it % k_tiles
        tile_m, tile_n = tile % tiles_m, tile // tiles_m
        load_x(x, x_tiles, stage, tile_m * bm_, kt, m, tx)
        T.ptx_commit_group()
        nb, kb = tile_n * (bn_ // example.FRAG_N), kt * (bk_ // example.FRAG_K)
        T.async_copy(codes[nb : nb + bn_ // example.FRAG_N, kb : kb + bk_ // example.FRAG_K, :], code_tiles[stage, :, :, :])
        T.async_copy(scales[nb : nb + bn_ // example.FRAG_N, kb : kb + bk_ // example.FRAG_K, :], scale_tiles[stage, :, :, :])

    M = T.dynamic("m")
    ops = example.operands(n, k, M)

    @T.prim_func
    def nvfp4_w4a16_streamk(
        x: ops.x,
        codes: ops.codes,
        scales: ops.scales,
        alpha_x128: ops.alpha_x128,
        y: ops.y,
        partials: ops.partials,
        tickets: ops.tickets,
        grid: T.int32,
    ):
        with T.Kernel(grid, threads=threads) as g:
            x_tiles = T.alloc_shared((stages, bm_, bk_), T.bfloat16)
            code_tiles = T.alloc_shared((stages, bn_ // example.FRAG_N, bk_ // example.FRAG_K, example.WORDS_PER_BLOCK), T.int32)
            scale_tiles = T.alloc_shared((stages, bn_ // example.FRAG_N, bk_ // example.FRAG_K, example.SCALE_WORDS_PER_BLOCK), T.int32)
            a_frag = T.alloc_local((2 * shape.m16_tiles_per_warp * 8,), T.bfloat16)
            b_frag = T.alloc_local((32,), T.bfloat16)
            acc = T.alloc_local((wt.acc_size,), T.float32)
            ticket = T.alloc_shared((1,), T.int32)
            T.import_source(example.DEVICE_SOURCE)
            if assume_positive_grid:
                T.assume(grid > 0)
                T.assume(M > 0)
            tx = T.get_thread_binding()
            lane = tx % 32
            warp_m = tx // 32 // shape.warps_n
            warp_n = tx // 32 % shape.warps_n
            tiles_m = T.ceildiv(M, bm_)
            iterations = tiles_m * tiles_n * k_tiles
            begin, end = streamk_range(g, iterations, grid)

            for q in T.unroll(wt.acc_size):
                acc[q] = 0.0
            # Prologue: the first stages - 1 iterations in flight. Each stage is COPIES_PER_STAGE
            # commit groups (x, codes, scales); a missing stage commits empty groups so counts match.
            for s in T.unroll(stages - 1):
                if begin + s < end:
                    load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, begin + s, s, tiles_m, M, tx)
                else:
                    for _ in T.unroll(COPIES_PER_STAGE):
                        T.ptx_commit_group()
            for it in T.serial(begin, end):
                stage = (it - begin) % stages
                T.ptx_wait_group(COPIES_PER_STAGE * (stages - 2))
                # The one barrier per k tile: stage `it` is visible to every thread, and every
                # thread is done with the stage the next load overwrites (iteration it - 1's).
                T.sync_threads()
                if it + stages - 1 < end:
                    load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, it + stages - 1, (it - begin + stages - 1) % stages, tiles_m, M, tx)
                else:
                    for _ in T.unroll(COPIES_PER_STAGE):
                        T.ptx_commit_group()
                wt.mma_k_tile(
                    lambda r, c: x_tiles[stage, r, x_swizzled(r, c)],
                    lambda nb, kb, w: code_tiles[stage, nb, kb, w],
                    lambda nb, kb, w: scale_tiles[stage, nb, kb, w],
                    a_frag, b_frag, acc, lane, warp_m, warp_n, 0,
                )  # fmt: skip
                tile = it // k_tiles
                if it % k_tiles == k_tiles - 1 or it == end - 1:  # this CTA's piece of `tile` ends
                    tile_begin = tile * k_tiles
                    row0, col0 = wt.origin(tile % tiles_m, tile // tiles_m, lane, warp_m, warp_n)
                    if begin <= tile_begin and it == tile_begin + k_tiles - 1:
                        wt.store_output(acc, y, alpha_x128, row0, col0, M)  # the whole tile: no partials
                    else:
                        fixup(
                            acc, partials, tickets, ticket, g, tile, iterations, grid, tx,
                            lambda acc: wt.store_output(acc, y, alpha_x128, row0, col0, M),
                        )  # fmt: skip
                    for q in T.unroll(wt.acc_size):
                        acc[q] = 0.0
            T.ptx_wait_group(0)

    return nvfp4_w4a16_streamk


def build_wgmma_streamk_kernel(n: int, k: int, config: WgmmaStreamKConfig):
    """Stream-K over the wgmma kernel for an ``N x K`` weight (sm_90a); the grid size is a run-time scalar.

    Output tile ``t`` is x block ``t % tiles_x`` of weight tile ``t // tiles_x`` (neighbouring x blocks
    share weights through L2). The first ``sk_tiles`` tiles (a run-time scalar, ``streamk_tiles``)
    run as stream-K: CTA ``g``'s range of their (tile, k tile) iterations is cut into segments, one
    per tile it touches; then, with ``streamk_waves``, it takes tiles ``sk_tiles + g + j * grid``
    whole. Each segment runs the wgmma kernel's pipeline, a whole tile's with its k-tile count
    static where the x block is narrow (``hopper.TWO_LOOPS_MAX_BLOCK_X``), a piece's with a run-time one. A
    segment that covers its whole tile stores it; pieces go through ``streamk_fixup``. With a
    producer warpgroup (``config.producer``) it walks the same segments issuing the loads while the
    consumers run ``pipe.consume`` on each and store or fix up; they meet only at the stage barriers.
    """
    import tilelang.language as T

    bx, stages = config.block_x, config.stages
    k_tiles = k // config.block_k
    tiles_n = n // hopper.CTA_ROWS
    pipe = hopper.wgmma_pipeline(
        bx, stages, config.tma_loads, config.warpgroups, config.block_k, config.producer, config.ctas_per_sm,
        hopper.streamk_producer_registers(config.warpgroups, config.ctas_per_sm), config.a_batches, config.scale_pairs,
    )  # fmt: skip
    threads = pipe.threads
    fixup = streamk_fixup(pipe.acc_size, pipe.consumer_threads, k_tiles, pipe.sync_consumers)
    M = T.dynamic("m")
    ops = example.operands(n, k, M)

    @T.macro
    def cut(segment, where, tiles_x):
        """Segment ``where = (tile, begin, end)``, a tile clipped to the iterations ``[begin, end)``,
        into ``segment[0:4]``: its x block, weight tile, k-tile count and first k tile; returns the
        tile, those and ``segment[4]``, the k tiles before it."""
        tile, begin, end = where
        segment[0] = tile % tiles_x
        segment[1] = tile // tiles_x
        segment[2] = T.min(end, tile * k_tiles + k_tiles) - T.max(begin, tile * k_tiles)
        segment[3] = T.max(begin, tile * k_tiles) - tile * k_tiles
        # ``max(.., 0)``: the k tiles before are never negative, and so proved the stage indices
        # ``(base + t) % stages`` compile without floor-modulo sign fix-ups (the 34816x5120 M = 17-32
        # config's consumer loop: 723 SASS instructions per two k tiles against 751).
        return tile, segment[0], segment[1], segment[2], segment[3], T.max(segment[4], 0)

    phases = 2 if config.streamk_waves else 1  # stream-K pieces, then whole tiles (streamk_segments)

    def phase_loop(phase, g, begin, end, tiles, sk_tiles, grid):
        return streamk_segments(phase, g, begin, end, tiles, sk_tiles, grid, k_tiles, T.if_then_else)

    def where(phase, s, g, begin, end, sk_tiles, grid):
        return streamk_segment(phase, s, begin, end, g, sk_tiles, grid, k_tiles, T.if_then_else)

    # A whole tile's pipeline loop with its trip count static, as the whole-tile kernel's; a piece's
    # with a run-time count. With the run-time count for every segment, stream-K took 1.06x the time
    # of the static loop for the same tiles (H200, 16384x5120 M = 32 at 128 CTAs, one tile each: 21.12
    # against 19.90 us; whole tiles 18.87; results/h200_ab_2026-12-01x_whole_tile_static.json). Only
    # for narrow x blocks (``hopper.TWO_LOOPS_MAX_BLOCK_X``).
    @T.macro
    def static_when_whole(run, count, kt0):
        if count == k_tiles:
            run(k_tiles, 0)
        else:
            run(count, kt0)

    def run_segment(run, count, kt0):
        if bx <= hopper.TWO_LOOPS_MAX_BLOCK_X:
            static_when_whole(run, count, kt0)
        else:
            run(count, kt0)

    @T.macro
    def summed_here(summed):
        summed[0] = 1

    @T.macro
    def finish(acc, x_tiles, stage, ticket, summed, g, tile, iterations, grid, count, bm, bn, tx, y, alpha_x128, partials, tickets):
        """A segment's result: the whole tile, or the sum of its pieces if ``fixup`` made this CTA
        its reducer, stored through ``stage`` (its last k tile's). ``fixup`` only marks the reducer,
        so both go through one store site: with a second one for the sum, ptxas spilled 104 bytes
        (256 x rows with a producer, 2026-11-30)."""
        summed[0] = 0
        if count < k_tiles:
            fixup(acc, partials, tickets, ticket, g, tile, iterations, grid, tx, lambda acc: summed_here(summed))
        if count == k_tiles or summed[0] == 1:
            pipe.store(acc, x_tiles, stage, bm, bn, y, alpha_x128, M, tx, True)

    @T.prim_func
    def nvfp4_w4a16_wgmma_streamk(
        x: ops.x,
        codes: ops.codes,
        scales: ops.scales,
        alpha_x128: ops.alpha_x128,
        y: ops.y,
        partials: ops.partials,
        tickets: ops.tickets,
        grid: T.int32,
        sk_tiles: T.int32,
    ):
        with T.Kernel(grid, threads=threads) as g:
            x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc = pipe.setup()
            ticket = T.alloc_shared((1,), T.int32)
            # A segment's tile coordinates and k range, computed once into registers: as expressions
            # they were re-evaluated, with run-time divisions, in every unrolled accumulator's store.
            # The fifth counts the k tiles the stages ran before it: the barrier phases go on from there.
            segment = T.alloc_local((5,), T.int32)
            segment[4] = 0
            summed = T.alloc_local((1,), T.int32)
            T.assume(grid > 0)
            T.assume(M > 0)
            tx = T.get_thread_binding()
            tiles_x = T.ceildiv(M, bx)
            # The host passes sk_tiles = every tile unless streamk_waves (streamk_tiles).
            iterations = sk_tiles * k_tiles if config.streamk_waves else tiles_x * tiles_n * k_tiles
            T.assume(sk_tiles >= 0)
            begin, end = streamk_range(g, iterations, grid)
            if config.producer:  # the producer walks the same segments; the consumers store
                if tx >= pipe.consumer_threads:
                    T.set_max_nreg(pipe.producer_registers, 0)
                    for phase in T.unroll(phases):
                        for s in T.serial(*phase_loop(phase, g, begin, end, tiles_x * tiles_n, sk_tiles, grid)):
                            tile, bm, bn, count, kt0, base = cut(segment, where(phase, s, g, begin, end, sk_tiles, grid), tiles_x)
                            run_segment(
                                lambda count, kt0: pipe.produce(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, count, kt0, base, bm, bn, M, tx), count, kt0
                            )
                            segment[4] = base + count
                else:
                    T.set_max_nreg(pipe.consumer_registers, 1)
                    for phase in T.unroll(phases):
                        for s in T.serial(*phase_loop(phase, g, begin, end, tiles_x * tiles_n, sk_tiles, grid)):
                            tile, bm, bn, count, kt0, base = cut(segment, where(phase, s, g, begin, end, sk_tiles, grid), tiles_x)
                            run_segment(
                                lambda count, kt0: pipe.consume(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, M, tx),
                                count,
                                kt0,
                            )
                            segment[4] = base + count
                            last_stage = (segment[4] - 1) % stages
                            finish(acc, x_tiles, last_stage, ticket, summed, g, tile, iterations, grid, count, bm, bn, tx, y, alpha_x128, partials, tickets)
                            T.mbarrier_arrive(empty[last_stage])  # the stage ``consume`` held for the store
            else:
                for phase in T.unroll(phases):
                    for s in T.serial(*phase_loop(phase, g, begin, end, tiles_x * tiles_n, sk_tiles, grid)):
                        tile, bm, bn, count, kt0, base = cut(segment, where(phase, s, g, begin, end, sk_tiles, grid), tiles_x)
                        run_segment(
                            lambda count, kt0: pipe.segment(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, M, tx), count, kt0
                        )
                        segment[4] = base + count
                        T.sync_threads()  # every warp is done with the stages the next segment's prologue refills
                        finish(acc, x_tiles, (segment[4] - 1) % stages, ticket, summed, g, tile, iterations, grid, count, bm, bn, tx, y, alpha_x128, partials, tickets)

    return nvfp4_w4a16_wgmma_streamk


def compile_streamk(n: int, k: int, config: StreamKConfig, arch: str, assume_positive_grid: bool = True):
    """Lower and compile the stream-K kernel for ``arch``; needs nvcc, not a GPU."""
    import tilelang

    check_streamk_config(config, n, k, smem_per_sm(arch))
    func = build_streamk_kernel(n, k, config.kernel_shape(), assume_positive_grid)
    return tilelang.compile(func, target={"kind": "cuda", "arch": arch}, pass_configs=STREAMK_PASS_CONFIGS)


# The kernel places its barriers and bounds itself, as the wgmma kernel does (see there).
STREAMK_PASS_CONFIGS = hopper.HAND_PIPELINE_PASS_CONFIGS


# Stream-K's producer keeps hopper.PRODUCER_REGISTERS (at one CTA per SM: see
# ``hopper.streamk_producer_registers``), so its consumers get 232 registers, not the
# unsplit kernel's 240: ptxas serialized the wgmmas of 352 x rows there (C7512), as it kept those
# of 320 asynchronous (sm_90a, 2026-12-01).
WGMMA_STREAMK_MAX_BLOCK_X = 320


def check_wgmma_streamk_config(config: WgmmaStreamKConfig, n: int, k: int) -> None:
    """The wgmma kernel's checks on the segment config at ``ctas_per_sm`` CTAs per SM (which must fit
    one SM's shared memory and registers), plus stream-K's own limits."""
    example.check_config(config, n, k, CONFIG_TYPES)
    if not 1 <= config.ctas_per_sm <= MAX_CTAS_PER_SM:
        raise ValueError(f"config {config}: ctas_per_sm must be 1..{MAX_CTAS_PER_SM}")
    try:
        hopper.check_wgmma_config(config.segment_config(), n, k, ctas_per_sm=config.ctas_per_sm)
    except ValueError as e:
        raise ValueError(f"config {config}: {e}") from None
    if config.block_x > WGMMA_STREAMK_MAX_BLOCK_X:
        raise ValueError(f"config {config}: stream-K takes x blocks of at most {WGMMA_STREAMK_MAX_BLOCK_X} rows")
    if config.block_x > hopper.ONE_WARPGROUP_MAX_BLOCK_X and config.ctas_per_sm != 1:
        # 256 threads holding over 64 accumulators each: more than half of an SM's 64K registers.
        raise ValueError(f"config {config}: x blocks over {hopper.ONE_WARPGROUP_MAX_BLOCK_X} rows (two warpgroups) need ctas_per_sm = 1")


def compile_wgmma_streamk(n: int, k: int, config: WgmmaStreamKConfig):
    """Lower and compile stream-K over the wgmma kernel for sm_90a; needs nvcc, not a GPU."""
    import tilelang

    check_wgmma_streamk_config(config, n, k)
    func = build_wgmma_streamk_kernel(n, k, config)
    return tilelang.compile(func, target={"kind": "cuda", "arch": hopper.WGMMA_ARCH}, pass_configs=STREAMK_PASS_CONFIGS)


HOPPER_CONFIGS = (hopper.WgmmaConfig, WgmmaStreamKConfig)


def check_any_config(config: AnyConfig, n: int, k: int, arch: str) -> None:
    """Raise ``ValueError`` unless ``config`` (any kernel's) divides an ``n x k`` weight and runs on ``arch``."""
    if isinstance(config, HOPPER_CONFIGS) and arch != "sm_90":
        raise ValueError(f"config {config}: the wgmma kernels run on sm_90 only, not {arch}")
    if isinstance(config, hopper.WgmmaConfig):
        hopper.check_wgmma_config(config, n, k)
    elif isinstance(config, WgmmaStreamKConfig):
        check_wgmma_streamk_config(config, n, k)
    elif isinstance(config, StreamKConfig):
        check_streamk_config(config, n, k, smem_per_sm(arch))
    elif isinstance(config, SkinnyConfig):
        skinny.check_skinny_config(config, n, k, arch)
    else:
        example.check_config(config, n, k)


def compile_any(n: int, k: int, config: AnyConfig, arch: str):
    """Compile whichever kernel ``config`` names (the wgmma kernel always for sm_90a)."""
    if isinstance(config, hopper.WgmmaConfig):
        return hopper.compile_wgmma(n, k, config)
    if isinstance(config, WgmmaStreamKConfig):
        return compile_wgmma_streamk(n, k, config)
    if isinstance(config, StreamKConfig):
        return compile_streamk(n, k, config, arch)
    if isinstance(config, SkinnyConfig):
        return skinny.compile_skinny(n, k, config, arch)
    return example.compile_kernel(n, k, config, arch)


_STREAMK_KERNELS: dict = {}


def launch_streamk(x: torch.Tensor, w: NVFP4W4A16Weight, config: StreamKConfig, out: torch.Tensor) -> None:
    """One launch of the stream-K kernel on checked inputs (at most 1024 rows)."""
    arch = example.device_arch(w.device)
    check_streamk_config(config, w.n, w.k, smem_per_sm(arch))
    shape = config.kernel_shape()
    iterations = math.ceil(x.shape[0] / shape.block_m) * (w.n // shape.block_n) * (w.k // shape.block_k)
    compile_fn = functools.partial(compile_streamk, w.n, w.k, config, arch)
    _run_streamk(x, w, config, out, iterations, shape.block_m * shape.block_n, (w.n, w.k, shape, w.device.index), compile_fn)


def launch_wgmma_streamk(x: torch.Tensor, w: NVFP4W4A16Weight, config: WgmmaStreamKConfig, out: torch.Tensor) -> None:
    """One launch of stream-K over the wgmma kernel on checked inputs (at most 1024 rows); sm_90 only."""
    check_any_config(config, w.n, w.k, example.device_arch(w.device))
    tiles, shared = wgmma_streamk_share(x.shape[0], w.n, w.k, config, example.sm_count(w.device))
    kernel_config = config._replace(streamk_waves=min(config.streamk_waves, 1))  # the share is a launch argument
    compile_fn = functools.partial(compile_wgmma_streamk, w.n, w.k, kernel_config)
    _run_streamk(x, w, config, out, tiles * (w.k // config.block_k), config.block_x * hopper.CTA_ROWS, (w.n, w.k, kernel_config, w.device.index), compile_fn,
                 (shared,))


def _run_streamk(x, w, config, out, iterations: int, tile_floats: int, key, compile_fn, scalars: tuple = ()) -> None:
    """What both stream-K launchers share: the grid, the 32-bit offset check, the kernel cache, the
    partial slots (``tile_floats`` per slot) and the tickets. ``scalars``: the kernel's arguments
    after the grid."""
    grid = streamk_grid(example.sm_count(w.device), config.ctas_per_sm, iterations)
    if (iterations + 1) * (grid + 1) >= 2**31:
        raise ValueError(f"config {config}: {iterations} iterations x {grid} CTAs exceed 32-bit offsets")
    kernel = _STREAMK_KERNELS.get(key)
    if kernel is None:  # compiling inside a CUDA-graph capture works (see the example)
        kernel = _STREAMK_KERNELS[key] = compile_fn()
    ws = example._ensure_workspace(w.device, tickets=example._tickets_needed(w.n))
    partials = torch.empty(grid * PARTIAL_SLOTS_PER_CTA * tile_floats, dtype=torch.float32, device=x.device)
    kernel(x, w.codes, w.scales, w.alpha_x128, out, partials, ws.tickets, grid, *scalars)


# ----------------------------------------------------------------------------------------------
# 2. The stream-K heuristic
# ----------------------------------------------------------------------------------------------

MIN_STREAMK_ITERATIONS_PER_CTA = 8  # shorter ranges spend more on the partial fix-up than they win
STREAMK_MIN_BLOCK_M = 48


def get_streamk_config(m: int, n: int, k: int, *, sm_count: int = 132) -> AnyConfig:
    """Stream-K where it has measured faster than the example's kernels, else the example's choice.

    Measured on the H200 (2026-11-29, one run, 16384x5120 and 5120x6144 at M = 1, 16, 64, 256, 1024):
    stream-K over one CTA per SM won only where the example has to split K under 48- or 64-row
    fragment tiles (5120x6144, M = 64: 30.8 us against 40.6 us); elsewhere it lost by up to 1.7x
    (one 4-warp CTA per SM hides too little latency, and a tile's reduction stalls the reducing
    CTA's pipeline). The tuned tables decide per shape; this is the fallback without one.
    """
    base = example.get_config(m, n, k, sm_count=sm_count)
    shape = base.kernel_shape()
    if not (isinstance(base, FragConfig) and base.split_k > 1 and shape.block_m >= STREAMK_MIN_BLOCK_M):
        return base
    iterations = math.ceil(m / shape.block_m) * (n // shape.block_n) * (k // shape.block_k)
    if iterations < MIN_STREAMK_ITERATIONS_PER_CTA * sm_count:
        return base
    return StreamKConfig(shape.block_m, shape.block_n, shape.block_k, shape.warps_m, shape.warps_n, base.stages, 1)


WGMMA_STREAMK_CTAS_PER_SM = 2
# One warpgroup's stream-K takes 128-deep k tiles (hopper.DEEP_K, DEFAULT_STAGES of them) up to this x
# block, where two such CTAs still share an SM. H200, 2026-11-30h, against 64-deep tiles, both 4
# stages and two CTAs per SM: faster in all 42 cells measured (nine shapes, M = 1-64, x blocks of
# 16-64 rows; 0.81-1.00x the time, 0.93x on geometric mean; 34816x5120 M = 16, 39.0 us against
# 48.3). Wider blocks would keep one CTA per SM.
STREAMK_DEEP_K_MAX_BLOCK_X = 64
# Below SMALL_M, stream-K only where the split-K kernel's CTAs load the SMs very unevenly: there the
# 128-deep stream-K won every cell measured (H200, 2026-11-30h; in-sample): 11008x4096 (172 CTAs,
# 1.53x the mean) M = 32, 48, 56, 18.4 / 21.2 / 23.9 us against 19.4 / 23.0 / 27.7; the tuner took it
# at M = 17-64 on 34816x5120 (1.46) and 5120x17408 (1.65). At 6144x4096 (192 CTAs, 1.38) the split-K
# kernel won M = 16, 32 and 56 by 4-10 % and lost M = 48 by 2 %.
SMALL_M_STREAMK_MIN_IMBALANCE = 1.45
# From SMALL_M, one warpgroup's stream-K becomes two consumer warpgroups (one m64 atom each of the same
# x block) with a producer warpgroup, one CTA per SM, 128-deep k tiles. H200, 2026-11-30j: the
# tuner's --twins on the dispatch's one-warpgroup stream-K at M = 72, 96, 128 (64-deep twins) won all
# six cells of the untuned shapes it decides, 6144x4096 and 11008x4096, by 8-15 % (11008x4096 M =
# 128: 30.1 us against 34.9); the tuner, offered them with 64- and 128-deep tiles at M = 64-128, took
# the 128-deep one in all eight cells of 34816x5120 and 5120x17408 (5120x17408 M = 128: 43.4 against
# 53.7 for the table's one-warpgroup stream-K). Below SMALL_M it lost 34816x5120 M = 16-48 by 4-15 %.
# The untuned run after the change (results/h200_untuned_2026-11-30j.json, all verified) has 21 cells
# where it decides, 11 of them above 128 rows (one warpgroup's 128-row x blocks, e.g. 4096x11008 M =
# 384: 54.5 us against 64.4), and each ran faster than in the run before it: 0.78-0.94x.
STREAMK_TWO_WARPGROUPS_MIN_M = hopper.SMALL_M
# Where two warpgroups' x block (up to 256 rows) would run as stream-K with fewer tiles than SMs (every
# tile cut, into three pieces or more at 40-48 weight tiles) and one warpgroup's tight blocks are two
# full 128-row blocks (M = 225-256), stream-K over those instead: two warpgroups, one m64 atom each,
# 128 deep, as the dispatch runs them from SMALL_M up to 128 rows. Half the partial bytes per piece
# and half the pieces per tile outweigh dequantizing the weights twice. H200, 2026-11-30s
# (results/h200_timings_2026-11-30s_two_warpgroups_m256-1024.json and _retune_m232-768.json; in-
# sample): M = 256 on 11008x4096, 4096x11008 and 6144x4096 40.5 / 39.8 / 27.1 us against 45.0 / 45.6 /
# 32.9; 5120x6144 M = 232 30.9 against 36.0; 5120x17408 M = 256 69.9 against 71.4, M = 232 69.2
# against 67.6 (the one loss). With more tiles than SMs it lost: 34816x5120 (272 tiles) M = 232 134.4
# against 123.9, M = 256 136.1 against 134.0. It only ever narrows: at M = 113-120 the small-M
# one-wave rule's 120-row tiles stay 120 rows as stream-K, 0.97x the time of 128-row ones in all four
# cells raced (6144x4096 and 11008x4096 at M = 113 and 120; H200, 2026-12-02i, results/h200_ab_
# 2026-12-02i_streamk_keeps_the_8_row_block.json: 16.63 us against 17.09 at 6144x4096 M = 113).
NARROW_STREAMK_BLOCK_X = hopper.TMA_BLOCK_X
# From TWO_BLOCK_STREAMK_MIN_M to hopper.SPLIT_WAVE_MAX_M rows, where two x blocks give more tiles than
# SMs (so the split wave does not apply) and K is whole 128-deep tiles: stream-K over two x blocks
# (8-row steps, at most 176 rows), 128 deep, two consumer warpgroups and a producer, behind the two-
# wave rule (``heuristic_config`` asks it of every stream-K config). Before, those cells ran stream-K
# or whole tiles over two 64-deep blocks of 144-176 rows, one warpgroup's 96-128-row blocks, or
# three 104-120-row ones (two waves). H200, 2026-12-02l (results/h200_ab_2026-12-02l_two_block_
# streamk.json, 3 rounds, every config checked against the FP32 reference): on six shapes at M =
# 272, 304 and 352, 0.80-0.97x the time in the 16 cells it changes (11008x4096 M = 272 39.04 us
# against 46.53; 18944x3584 M = 352 70.51 against 87.80); the same blocks 64 deep took 1.01-1.11x
# the 128-deep ones' time, and the dispatch's own blocks 128 deep 1.03-1.13x, so both the depth and
# the two tight blocks count. Held out, twelve other shapes at M = 257-345: 0.78-0.99x in 23 of 24
# cells (18944x6144 M = 345 111.67 against 143.71), 1.013x on 32768x8192 M = 305. At M = 192-256 the
# same blocks lost to the dispatch's in 11 of 14 cells of the forty-ninth session's race e (one
# x block of all M rows dequantizes the weights once).
TWO_BLOCK_STREAMK_MIN_M = 257


@functools.lru_cache(maxsize=None)  # every eager call without a table entry asks (5-15 us each uncached)
def heuristic_config(m: int, n: int, k: int, *, arch: str, sm_count: int) -> AnyConfig:
    """Without a tuned entry: on sm_90 the skinny kernel up to two n8 tiles of rows where the shape
    divides into one (``skinny.heuristic_config``; fitted to the tuner's timings of the tuned
    shapes and four untuned ones, results/h200_timings_2026-12-01p_untuned_skinny_m1-16.json),
    then up to 32 rows one warpgroup's split-K at two CTAs per SM where 2-3 splits fill them
    (``hopper.two_cta_split_wave_config``), else one wave of whole tiles where the weight tiles are
    few (``hopper.one_wave_config``; up to hopper.SPLIT_WAVE_FIRST_MAX_M rows, and past them where those blocks are under
    hopper.ONE_WAVE_FIRST_MIN_BLOCK_X rows, of split tiles first: ``hopper.split_wave_config``; over
    two x blocks where one block's splits are as short as that rule allows:
    ``hopper.two_block_split_wave_config``), two whole waves where that beats stream-K or one
    warpgroup (``hopper.two_waves_config``), else the wgmma kernel where its heuristic takes the shape
    (as stream-K where its CTAs would load the SMs unevenly: see hopper.WGMMA_STREAMK_MIN_IMBALANCE and,
    below hopper.SMALL_M, SMALL_M_STREAMK_MIN_IMBALANCE; from STREAMK_TWO_WARPGROUPS_MIN_M with two
    consumer warpgroups and a producer; at M = 225-256 over 128-row x blocks where the wider ones
    give fewer tiles than SMs, NARROW_STREAMK_BLOCK_X; at M = 257-352 over two 128-deep x blocks where
    those give more tiles than SMs, TWO_BLOCK_STREAMK_MIN_M), else the stream-K heuristic (which falls back
    to the example's); and where what that leaves is split-K whose CTAs fill at most
    hopper.FEW_CTAS_MAX_FILL of the SMs, the narrow split wave (``hopper.narrow_split_wave_config``).
    Other archs never get wgmma."""
    if arch != "sm_90":
        return get_streamk_config(m, n, k, sm_count=sm_count)
    few_rows = skinny.heuristic_config(m, n, k, sm_count=sm_count)
    if few_rows is not None:
        return few_rows
    two_ctas = hopper.two_cta_split_wave_config(m, n, k, sm_count=sm_count)
    if two_ctas is not None:
        return two_ctas
    one_wave = hopper.one_wave_config(m, n, k, sm_count=sm_count)
    narrow_whole_blocks = one_wave is None or one_wave.block_x < hopper.ONE_WAVE_FIRST_MIN_BLOCK_X
    split_wave_first = (m <= hopper.SPLIT_WAVE_FIRST_MAX_M or narrow_whole_blocks) and hopper.split_wave_config(m, n, k, sm_count=sm_count) is not None
    if one_wave is not None and not split_wave_first:
        return one_wave  # whole tiles, at most one per SM: nothing for stream-K to even out
    two_blocks = hopper.two_block_split_wave_config(m, n, k, sm_count=sm_count) if split_wave_first else None
    if two_blocks is not None:
        return two_blocks  # as it is: its stream-K form lost (see there)
    config = _wgmma_heuristic_config(m, n, k, sm_count)
    one_warpgroup = isinstance(config, hopper.WgmmaConfig) and config.warpgroups == 1
    if isinstance(config, WgmmaStreamKConfig) or one_warpgroup:
        whole = hopper.two_waves_config(m, n, k, sm_count=sm_count)
        if whole is None and one_warpgroup:
            whole = hopper.one_wave_config(m, n, k, sm_count=sm_count, over_one_warpgroup=True)
        if whole is not None:
            return whole
    if type(config) is hopper.WgmmaConfig and hopper.wgmma_ctas(config, m, n) <= hopper.FEW_CTAS_MAX_FILL * sm_count:
        return hopper.narrow_split_wave_config(m, n, k, sm_count=sm_count) or config
    return config


def _wgmma_heuristic_config(m: int, n: int, k: int, sm_count: int) -> AnyConfig:
    """``heuristic_config`` on sm_90 short of the whole-wave rules."""
    if TWO_BLOCK_STREAMK_MIN_M <= m <= hopper.SPLIT_WAVE_MAX_M and 2 * (n // hopper.CTA_ROWS) > sm_count and k % hopper.DEEP_K == 0:
        return WgmmaStreamKConfig(hopper.x_block_rows(m, 2), hopper.DEEP_K, hopper.DEFAULT_STAGES, 1, True, 2, True)
    config = hopper.get_wgmma_config(m, n, k, sm_count=sm_count)
    if config is None:
        return get_streamk_config(m, n, k, sm_count=sm_count)
    ctas = hopper.wgmma_ctas(config, m, n)
    iterations = ctas // config.split_k * (k // config.block_k)  # output tiles x k tiles
    per_sm = WGMMA_STREAMK_CTAS_PER_SM if config.warpgroups == 1 else 1  # two warpgroups: one CTA per SM
    if m >= hopper.SMALL_M:
        min_imbalance = hopper.WGMMA_STREAMK_MIN_IMBALANCE
    elif m >= hopper.HEURISTIC_MIN_M and config.warpgroups == 1:
        min_imbalance = SMALL_M_STREAMK_MIN_IMBALANCE
    else:
        # M <= 16: the split rules even the CTAs out (hopper.UNEVEN_SPLIT_MAX_BLOCK_X); below SMALL_M two
        # warpgroups are one wave, a CTA per SM at most (hopper.split_wave_config).
        return config
    if example.sm_imbalance(ctas, sm_count) < min_imbalance or iterations < MIN_STREAMK_ITERATIONS_PER_CTA * per_sm * sm_count:
        return config
    deep_k = hopper.DEEP_K if k % hopper.DEEP_K == 0 else config.block_k
    if config.warpgroups == 2:
        one = hopper.tight_wgmma_config(m, n, k, sm_count=sm_count)
        narrower = one.block_x == NARROW_STREAMK_BLOCK_X < config.block_x
        if narrower and ctas < sm_count and deep_k == hopper.DEEP_K:  # see NARROW_STREAMK_BLOCK_X
            return WgmmaStreamKConfig(one.block_x, deep_k, hopper.DEFAULT_STAGES, 1, True, 2, True)
        return WgmmaStreamKConfig(config.block_x, config.block_k, hopper.DEFAULT_STAGES, 1, True, 2, config.producer)
    if m >= STREAMK_TWO_WARPGROUPS_MIN_M:
        return WgmmaStreamKConfig(config.block_x, deep_k, hopper.DEFAULT_STAGES, 1, True, 2, True)
    block_k = deep_k if config.block_x <= STREAMK_DEEP_K_MAX_BLOCK_X else config.block_k
    return WgmmaStreamKConfig(config.block_x, block_k, hopper.DEFAULT_STAGES, WGMMA_STREAMK_CTAS_PER_SM, config.tma_loads)


# ----------------------------------------------------------------------------------------------
# 3. Tuned tables
# ----------------------------------------------------------------------------------------------
#
# One JSON file per GPU key (compute capability and SM count: 132 SMs is both an H100 SXM and an
# H200, so a table never applies to another key). Each entry maps (N, K, M range) to a config:
#   {"key": "sm_90-132sm", "entries": [{"n": 16384, "k": 5120, "m_min": 1, "m_max": 16,
#                                       "kind": "StreamKConfig", "config": {...fields...}}, ...]}

TABLE_DIR = _HERE / "tuned"
_CONFIG_KINDS = {t.__name__: t for t in CONFIG_TYPES}


@functools.lru_cache(maxsize=None)
def gpu_key(device: torch.device) -> str:
    """``sm_90-132sm``: the compute capability and SM count a table was measured on (cached: it is
    looked up on every call)."""
    return f"{example.device_arch(device)}-{example.sm_count(device)}sm"


def table_path(key: str) -> pathlib.Path:
    return TABLE_DIR / f"{key}.json"


@functools.lru_cache(maxsize=None)
def load_table(key: str) -> dict:
    """``{(n, k): [(m_min, m_max, config), ...]}`` for a GPU key; empty when there is no table."""
    path = table_path(key)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("key") != key:
        raise ValueError(f"{path} holds the table for {data.get('key')!r}, not {key!r}")
    table: dict = {}
    for e in data["entries"]:
        table.setdefault((e["n"], e["k"]), []).append((e["m_min"], e["m_max"], config_from_json(e)))
    return table


def config_from_json(entry: dict) -> AnyConfig:
    return _CONFIG_KINDS[entry["kind"]](**entry["config"])


def config_to_json(config: AnyConfig) -> dict:
    return {"kind": type(config).__name__, "config": config._asdict()}


def tuned_config(m: int, n: int, k: int, key: str) -> Optional[AnyConfig]:
    for m_min, m_max, config in load_table(key).get((n, k), ()):
        if m_min <= m <= m_max:
            return config
    return None


# ----------------------------------------------------------------------------------------------
# 4. The public function
# ----------------------------------------------------------------------------------------------

LAUNCHERS = {
    FragConfig: example.launch,
    TileConfig: example.launch,
    StreamKConfig: launch_streamk,
    hopper.WgmmaConfig: hopper.launch_wgmma,
    WgmmaStreamKConfig: launch_wgmma_streamk,
    SkinnyConfig: skinny.launch_skinny,
}


def config_for(rows: int, n: int, k: int, device: torch.device) -> AnyConfig:
    """The tuned table of ``device``'s GPU first, then the heuristics."""
    config = tuned_config(rows, n, k, gpu_key(device))
    if config is None:
        config = heuristic_config(rows, n, k, arch=example.device_arch(device), sm_count=example.sm_count(device))
    return config


def pick_config(rows: int, w: NVFP4W4A16Weight) -> AnyConfig:
    return config_for(rows, w.n, w.k, w.device)


def nvfp4_w4a16_linear(
    x: torch.Tensor, w: NVFP4W4A16Weight, config: Optional[AnyConfig] = None, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The example's ``nvfp4_w4a16_linear`` with the tuned dispatch and the stream-K kernel."""
    return example.run_linear(x, w, config, out, pick_config, LAUNCHERS)
