"""Tuner: build the tuned table for the GPU it runs on.

For each shape and M breakpoint it times candidate configs (fragment, tile, stream-K and, on sm_90, wgmma) with the
benchmark's timer (CUDA-graph replay over >= 512 MB of rotated weights, separator subtracted), checks
the winner against the FP32 reference, and writes one entry per run of breakpoints that share a
winner to ``tuned/<key>.json`` (key: compute capability and SM count). ``--update`` keeps the entries
of shapes not tuned in this run, so a long tuning can be done one shape per invocation.

    python maint/gemm/gemm_sm120/tune_sm120_nvfp4_w4a16_gemm.py --shapes 16384x5120 --update

``--twins FIELD=VALUE[,...]`` measures instead of tuning: the config the dispatch picks at each shape
and M beside copies of it with those fields changed, each checked against the reference. With
``--update`` they are a tuning's only entrants (a dozen compiles where a re-tune of the cell takes
a hundred or more), and the winner takes the breakpoint's entry:

    python maint/gemm/gemm_sm120/tune_sm120_nvfp4_w4a16_gemm.py --ms 144,272 --twins producer=true --timings t.json
"""

import argparse
import datetime
import itertools
import json
import pathlib
import statistics
import sys
from typing import Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchmark_sm120_nvfp4_w4a16_gemm as bench  # noqa: E402
import sm120_nvfp4_w4a16_streamk as maint  # noqa: E402

skinny = maint.skinny

nv = maint.example


def fits(config, n: int, k: int, arch: str) -> bool:
    try:
        maint.check_any_config(config, n, k, arch)
        return True
    except ValueError:
        return False


# What the candidates vary, from the H200 sweeps of 2026-11-29 (NOTES.md): the split (what fills the
# SMs), a second k group of warps, and for Hopper the wgmma kernel's x block. Deeper cp.async
# pipelines than the heuristic's 3-4 stages measured slower (M = 1 is bound by issue, not bytes in
# flight), so the tuner does not spend compiles on them. That holds past sm_120's shared memory too:
# with the H200's 227 KB per CTA (a probe that lifted the fragment kernel's limit), 256-deep tiles
# at 4-6 stages and 512-deep at 2-4 took 1.02-1.10x the table's 3 stages of 256 on 16384x5120 at
# M = 1 and 16 (results/h200_timings_2026-12-01_deep_fragment_pipelines.json).
FRAG_SPLITS = (1, 2, 4, 8)
FRAG_WARPS_K = (1, 2)
# 256-deep k tiles halve the per-tile loop overhead (address math, barriers, cp.async issue) per
# weight: 3 % faster at M = 1 on 34816x5120 and 16384x5120 (one H200 run, split 1).
FRAG_DEEP_K = 256
FRAG_DEEP_K_STAGES = 3
# The M <= 16 fragment tile is latency-bound: on the H200 four 53 KB CTAs share an SM (3.5 warps per
# scheduler, issuing in 48 % of cycles; ncu, 2026-11-30), and on sm_120 (100 KB per SM) only one
# fits. So at M <= 16 the tuner also times shallower (block_k, stages) pairs: on sm_120 they fit
# 2-4 CTAs per SM, on the H200 block_k 64 fits six (registers allow six at 80 per thread).
FRAG_OCCUPANCY_SHAPES = ((128, 3), (64, 4), (64, 3))
# Where 128-row weight tiles number fewer than the SMs (N = 5120: 40), the M <= 16 tile is also
# offered 64 rows wide (two warps per CTA), over every split: the same CTA count with half the
# split, so each CTA streams twice the k tiles through its pipeline (5120x17408 and 5120x6144 run
# at 0.49-0.59 of the read floor at M <= 32, split 3-8, the furthest of the five shapes; H200,
# 2026-11-30k). Timed at M = 1, 8 and 16 on both (2026-11-30l): no cell's fastest, 2-18 % behind
# it (5120x17408 M = 16: 26.0 us against 25.5; 5120x6144 M = 16: 14.1 against 11.9).
FRAG_NARROW_N = 64
STREAMK_CTAS_PER_SM = (1, 2)
# The wgmma kernel at every M. At M <= 48 its x block is small and its CTAs light, and what wins
# is a deeper pipeline and a split the example's heuristic does not pick: one H200 sweep
# (2026-11-30) beat the fragment kernel at M = 32 on 34816x5120 (51.1 us against 60.5, 8-row steps
# of x), 5120x6144 (17.9 against 23.2) and 16384x5120 (24.4 against 25.3), with 4-8 stages and a
# split of 2-4; at M = 1-16 it won some cells and lost others by up to 9 %. An 8-row x block (the
# smallest wgmma N) pads M <= 8 half as much as 16.
WGMMA_SMALL_M = 48
WGMMA_SMALL_STAGES = (4, 8)
WGMMA_MIN_BLOCK_X = 8
WGMMA_STAGES = (4, 6)  # above WGMMA_SMALL_M; and, per x block, the deepest pipeline that keeps two CTAs per SM
# N = 5120 gives only 40 tiles per x block. Splits of 3 and 6 fit K = 6144 (96 k tiles) and fill the
# two CTA slots of every SM where powers of two leave a third empty (5120x6144 M = 256: 80 tiles x 3
# = 240 CTAs for 264 slots; split 2 gives 160); a split must divide the k tiles (``fits``).
WGMMA_SPLITS = (2, 3, 4, 6, 8)
WGMMA_BLOCK_X = (64, 128)  # beside the heuristic's tight x block: more CTAs per SM, or fewer x blocks
# Stream-K over the wgmma kernel, two CTAs per SM, per x block offered: it evens out the waves that
# 40-tile shapes (N = 5120) leave a third to half empty, where no split divides K evenly. With 64-deep
# k tiles, and with 128-deep ones where 4 stages fit (WGMMA_DEEP_K_MIN_STAGES, up to 64 rows): those
# won 8-15 % over 64-deep at M = 16-48 on 34816x5120 and 5120x17408 (H200, 2026-11-30h, scratch twins:
# 34816x5120 M = 32, 44.3 us against 52.4); three or four CTAs per SM of 64-deep tiles lost to them
# there (47.3 and 49.3 us). The 128-deep ones come with 4 stages and with the deepest pipeline that
# keeps two CTAs per SM (6 stages at 32 rows, 8 at 16): twice the bytes in flight that ncu found
# short at M = 16-32 (NOTES, 2026-11-30h). That one won 34816x5120 M = 32 by 2 % (44.3 us against
# 45.2) and lost M = 24 by 2 % (2026-11-30i): more bytes in flight alone buy little there.
WGMMA_STREAMK = maint.WgmmaStreamKConfig(stages=4, ctas_per_sm=2)
# Two warpgroups, above TWO_WARPGROUP_MIN_M rows. Above 128 rows the one x block that covers M (up
# to 256) dequantizes the weights once where two blocks of 128 rows or less dequantize them twice.
# One H200 run (2026-11-30, four shapes, M = 144-1024, against the tuned table) won 2-14 % with
# these two, one CTA per SM (registers allow no second): the deepest pipeline with no split, and
# stream-K (4 stages, and since 2026-11-30k the deepest pipeline too: at 32 rows, 8 stages of
# 128-deep tiles ran 5120x17408 in 26.4 us against 29.5 with 4). Splits of 2-4, and unsplit
# pipelines of 4 stages, never won. Both covers are offered: x blocks of at most one
# wgmma N (256), and of up to MAX_BLOCK_X (two wgmmas per k16 step, fewer x blocks): the wider ones
# won M = 272 and 304 on the three N >= 14336 shapes and some of M = 544-832 (2026-11-30f tuning).
# Each with and without the producer warpgroup: with it they won every cell of the twins at M =
# 144-832 (hopper.TWO_WARPGROUP_PRODUCER), but a tuning that offered only the producer ones lost
# 34816x5120 M = 1024 (its stream-K at 256 rows: 616.8 us, where the same config without a producer
# ran 515 in the 2026-11-30h benchmark; H200, 2026-11-30i).
# Up to 128 rows the two warpgroups take one m64 atom each of the same x block: without a producer
# they lost M = 24 and 48 (12-45 %, 2026-11-30), but with one they won M = 72-128 by 8-22 % where
# the table ran one warpgroup unsplit or as stream-K (H200, 2026-11-30j twins: 16384x5120 M = 96,
# 29.4 us against 37.8; 5120x17408 M = 128, 47.5 against 53.7), tied on 34816x5120 and lost to
# split-K on 5120x6144 (a producer allowed no split then; see SPLIT_PRODUCER_STAGES for the splits
# with one).
# At M = 32 and 48 the same twins won 5-14 % on 16384x5120, 14336x5120 and 5120x17408 and lost
# 34816x5120 (4-6 %) and 5120x6144 (split-K); at M = 16 they lost both cells that had a wgmma base
# (34816x5120, 5120x6144).
TWO_WARPGROUP_MIN_M = 16
# Their 128-deep stream-K form also with this many stages where the deepest pipeline is deeper.
# 8 was the deepest at 32 rows when it won 5120x17408 (2026-11-30k, above); once the deepest grew to
# 13, only 4 and 13 were offered, and 8 beat both at M = 17-32 on the two shapes that need stream-K
# there (H200, 2026-12-01w, results/h200_ab_2026-12-01w_streamk_whole_waves_m17-32.json: 5120x17408
# M = 24 and 32 in 24.70 and 25.12 us against 26.36-26.69 with 4 or 13 stages and the table's 25.68
# and 26.62; 34816x5120 M = 32 in 42.92 against 46.01-46.15).
TWO_WARPGROUP_STREAMK_STAGES = 8
# Each also with 128-deep k tiles where four stages fit (up to 176 rows). H200, 2026-11-30g, twins of
# the table's configs on the five default shapes: at 144 rows (5 stages, or 4 as stream-K) stream-K
# won 3-14 % on the three stream-K shapes (34816x5120 M = 144: 96.1 us against 111.6); with the three
# stages that fit from 192 rows they took 1.4-3.3x as long (16384x5120 M = 1024: 358.9 us against
# 242.1): the loads run only one tile ahead, though the SASS has 23 % fewer instructions per k.
# One warpgroup's 128-deep stream-K candidates (above) follow the same floor. The producer warpgroup
# releases a stage as soon as its wgmma retires, so three stages keep two loads in flight, not one;
# still, the three-stage 128-deep producer configs were never a cell's fastest (H200 2026-11-30i
# tuning, 60 cells at M = 192-1024: 1.04x their 64-deep twins' time on geometric mean, 0.94-1.15x),
# so the floor stays.
WGMMA_DEEP_K_MIN_STAGES = 4
# Narrow one-warpgroup 128-deep stream-K is raced with TMA loads too, against the cp.async that
# ``hopper.tma_loads_for`` gives x blocks this narrow: on 34816x5120 (two CTAs per SM, 6 stages) TMA
# ran M = 24 in 38.00 us against 39.85 and M = 32 in 37.95 against 40.32 (H200, 2026-12-01x,
# results/h200_ab_2026-12-01x_narrow_streamk_tma.json). At 48 rows TMA ran M = 48 in 42.06 us
# against the table's cp.async 47.56 (2026-12-02, results/h200_ab_2026-12-02d_tile_barrier.json),
# and the tuner then gave TMA 34816x5120 M = 33-48 (48 rows: 41.6 us against 48.1 for cp.async) and
# 49-64 (64 rows: 48.7 against 51.9 for the table's two warpgroups and a producer;
# results/h200_timings_2026-12-02c_34816_m40-64_tma48.json).
TMA_STREAMK_MAX_BLOCK_X = 64
# ... and those by TMA also with a producer warpgroup, which two CTAs per SM of one consumer
# warpgroup take only with the A registers in two batches per k tile (``WgmmaStreamKConfig.a_batches``:
# at one batch ptxas serializes the wgmmas). 34816x5120, 6 stages (H200, 2026-12-03i, tuner twins,
# results/h200_update_2026-12-03i_34816_a_batches.json): 0.95-0.98x the time at M = 24-64.
ONE_WARPGROUP_PRODUCER_A_BATCHES = 2
# Blocks up to UNEVEN_SPLIT_TMA_MAX_BLOCK_X rows (the narrow ones it was measured on) as split-K by
# TMA, at the deepest pipeline two CTAs per SM hold, over every split: a split need not divide the k tiles (``hopper.split_k_tiles``), so 5120x17408 (40 weight
# tiles, 136 k tiles of 128) gets splits of 3 and 6 (120 and 240 CTAs of 45-46 and 22-23 k tiles)
# besides stream-K. H200, 2026-12-02 (results/h200_ab_2026-12-02a_uneven_split.json), split 6 by TMA
# at 6 stages, us: M = 17 22.33 against the table's skinny 23.69, M = 24 22.52 against stream-K's
# 24.98, M = 32 23.88 against 24.70. The split-producer candidates also take
# TWO_WARPGROUP_STREAMK_STAGES: two consumer warpgroups and a producer at split 3 ran M = 32 in 23.02
# with 8 stages and 24.33 with 13, and the tuner gave that config 5120x17408 M = 17-32 (22.85-23.42
# against 23.32-23.81 for split 6 by TMA; results/h200_timings_2026-12-02z_uneven_split_m16-32.json).
UNEVEN_SPLIT_TMA_STAGES = 6
UNEVEN_SPLIT_TMA_MAX_BLOCK_X = 32
# Split-K on two consumer warpgroups and a producer, 128-deep k tiles, at M <= WGMMA_SMALL_M: on
# 5120x6144 (40 weight tiles per x block) split 3 ran M = 16 in 11.9 us against 12.4 for the table's
# one-warpgroup split 3, and lost M = 32 (17.7 against 14.4; H200, 2026-11-30k). The tuning of
# 2026-11-30l gave it 5120x6144 M = 1 and 9-16 (11.2 and 11.9 us). Above M = 48 it lost every cell
# timed at 5120x6144 while the split-K exchange spilled registers (M = 256: 66.9 us against 40.7 for
# stream-K). With fragment-order partials it won M = 64 and 128 there (16.5 and 23.3 us against 17.9
# and 24.5 for the table's stream-K) and still lost at 256 x rows (47.7 against 36.5 for one
# warpgroup's split 3; H200, 2026-11-30m), so above WGMMA_SMALL_M it is offered with the deepest
# pipeline for x blocks of up to SPLIT_PRODUCER_MAX_BLOCK_X rows. Up to WGMMA_SMALL_M it is offered
# with both: a split CTA streams few k tiles (16 at 5120x6144 split 3), so its time is mostly
# latency, and the deepest pipeline (17 stages at 16 rows, or as many as the split has k tiles)
# issues nearly all of them at once. The unsplit producer configs won M = 17-48 of 16384x5120 and
# 14336x5120 with their deepest pipelines (10-13 stages); the split ones had only
# SPLIT_PRODUCER_STAGES until 2026-11-30 (fourteenth session; not yet timed).
# Above 128 rows the two-warpgroup covers are the tight blocks of up to 256 rows and wider, but two
# warpgroups over one warpgroup's tight block (128 rows from M = 225), 128 deep, as stream-K, won
# where the dispatch ran the wider blocks as stream-K: 5120x6144 M = 232 and 256, 30.9 and 31.0 us
# against 36.0 and 34.9 for the table's; 11008x4096, 4096x11008 and 6144x4096 M = 256 by 10-17 %
# (H200, 2026-11-30s, results/h200_timings_2026-11-30s_retune_m232-768.json and _two_warpgroups_
# m256-1024.json). It lost 34816x5120 M = 232-384 by 2-8 %. Five stages lost to four in all nine
# cells timed, so it is offered with four.
NARROW_TWO_WARPGROUP_STREAMK = maint.WgmmaStreamKConfig(maint.hopper.ONE_WARPGROUP_MAX_BLOCK_X, maint.hopper.DEEP_K, 4, 1, True, 2, True)
# Stream-K with whole waves after it (``maint.streamk_tiles``), offered beside the two-warpgroup
# producer stream-K candidates (every stream-K winner above 192 rows was one) wherever their tiles
# outnumber the CTAs: the stream-K share of the left-over tiles alone, and of those plus a wave.
# H200, 2026-11-30 (first probe, the table's configs): 0.93-0.98x plain stream-K's time on 9 of 11
# cells; it lost 5120x6144 M = 512 and 1024 (1.04 and 1.05x).
STREAMK_WAVES = (1, 2)
WHOLE_WAVES = (1, 2)  # whole tiles cut to fill one or two waves (hopper.whole_waves_block_x)
SPLIT_PRODUCER_STAGES = maint.hopper.DEEP_K_STAGES
SPLIT_PRODUCER_MAX_BLOCK_X = maint.hopper.ONE_WARPGROUP_MAX_BLOCK_X
# ... and on one consumer warpgroup with its A registers in two batches, two CTAs per SM of 6 stages
# (the one-warpgroup stream-K's form, ONE_WARPGROUP_PRODUCER_A_BATCHES). Split 2 won M = 17-32 of
# 16384x5120 and 14336x5120, where 128 and 112 weight tiles leave a CTA per SM or fewer (H200,
# 2026-12-03k, tuner twins; results/h200_update_2026-12-03k_one_warpgroup_split_producer_m24.json
# and _m32.json): M = 24 17.9 and 17.7 us against 18.5 and 18.3 for two warpgroups unsplit, M = 32
# 18.7 and 18.2 against 18.8 and 18.5. It lost 5120x17408 and 5120x6144 M = 32 at every split
# (23.5-32.4 us against 23.2, 12.3-14.6 against 11.2 for two warpgroups' split 3). Wider x blocks
# take the deepest pipeline that keeps two CTAs per SM, the launch's (40 and 48 rows: 5).
ONE_WARPGROUP_SPLIT_PRODUCER_STAGES = 6
# Both one-warpgroup producer forms above also with the producer making the scale pairs
# (``scale_pairs``), at the deepest pipeline whose pairs still fit two CTAs per SM and one stage
# shallower, and at those depths without pairs (``scale_pair_twins``). H200, 2026-12-03 (fifty-ninth
# session, tuner twins at 4 and 5 stages; results/h200_update_2026-12-03l_*_scale_pairs.json), final
# times, us: pairs at 5 stages won 34816x5120 M = 24 (34.49 against 35.05 for the table's 6 stages
# without) and 40 (37.55 against 37.79 without), 16384x5120 M = 24 and 32 (17.62 and 18.35 against
# 17.89 and 18.47) and 14336x5120 M = 24 (17.43 against 17.65); 5 stages without pairs won
# 34816x5120 M = 32 (35.54 against 36.44 for 6). 24-row blocks were timed with pairs at 5 stages
# only, where 6 fit. On two consumer warpgroups the pairs lost (5120x17408 M = 32: 25.07 against
# 22.68 for the table's 8 stages without), so they are not offered there.
SCALE_PAIR_DEPTHS = 2
# Every candidate on the tight x block (16-row steps, ``hopper.TIGHT_ROW_STEP``) also on the block in
# 8-row steps where that is narrower, up to NARROW_TWINS_MAX_M rows: 24 at M = 17-24, 40 at 33-40, 56
# at 49-56. A wider wgmma N costs even where its rows are padding. On 34816x5120, the table's one-
# warpgroup stream-K config on the 8-row block against the 16-row one (H200, 2026-12-02f; results/
# h200_twins_2026-12-02f_narrow_x_and_seven_ctas.json): M = 24 37.3 against 38.4 us, M = 40 37.8
# against 43.0, M = 56 46.0 against 49.6. Two warpgroups share their x block (each takes one m64 atom
# of weight rows), so their twins take the same 8-row steps.
NARROW_TWINS_MAX_M = 64


# The skinny kernel (M <= 32): (rows_per_warp, warps, depth, ctas_per_sm), over SKINNY_SPLITS. From
# the H200 probe of 2026-12-01 (34816x5120 M = 1; NOTES, twenty-fifth session): the first three ran
# 27.7-28.4 us with four warps per CTA; with fewer bytes in flight per SM (depth 2 at 16 or fewer
# warps) 31.1, with 8 warps per CTA (two CTAs per SM) 36.8. Two-warp CTAs, nine per SM, hold all
# 1088 CTAs of 34816x5120 at once (27.7 us at split 4). Wider x blocks hold more accumulators, so
# they take one CTA per SM less.
# Depth 2 won no cell in the races of 2026-12-01 (M = 1-8, five shapes). Two-warp CTAs and four
# warps along N sharing one staged x lost at M = 1 on 34816x5120, their case (30.4 and 31.4 us
# against 28.67; results/h200_timings_2026-12-01h_skinny_m1_34816.json). With x through the warps'
# rings (2026-12-01, NOTES twenty-eighth session) one block per warp at depth 4 or 8 and 5 CTAs per
# SM won every M = 4 and 8 cell of the five shapes; past one n8 tile one block at 4 CTAs per SM or
# two at 3 won M = 16 on four of them. Four blocks per warp, which copy half the x per weight byte
# of two (at 32 rows a k32 block of x is 2 KB against a weight block's 576 bytes), lost every
# M = 16-32 cell of the five shapes, at best 1.14x the winner's time (34816x5120 M = 16; four warps
# at 3 CTAs per SM or two at 6; results/h200_timings_2026-12-01i_skinny_rings_m16-32.json).
# One block at 5 CTAs per SM (96 registers, no spills at 16 or 24 rows) evens out grids that two
# blocks at 3 per SM leave ragged: 5120x17408 (320 CTAs of two blocks on 396 slots, 640 of one on
# 660) M = 9 / 12 / 16 in 19.2 / 19.7 / 21.0 us against 22.2 / 22.2 / 22.4, 34816x5120 M = 9 / 12 in
# 32.5 / 34.3 against 34.6 / 35.0, but M = 16 in 36.3 against 35.2 (H200, 2026-12-01o, one process,
# 7 rounds; results/h200_ab_2026-12-01o_skinny_m9-16.json); 5120x17408 M = 17 in 24.1 against 25.8
# (2026-12-01r). Not offered, having lost every cell raced at M = 12-32 (2026-12-01r): one- and
# two-warp CTAs, which spread 34816x5120 evenly over the SMs and still took 1.02-2.0x the table's
# time (results/h200_ab_2026-12-01r_narrow_ctas.json), two warp groups along N at 5 CTAs per SM
# (results/h200_timings_2026-12-01r_skinny_warps_n2.json), and two blocks per warp at depth 2 and 3-4
# CTAs per SM past 16 rows (results/h200_ab_2026-12-01r_two_blocks_depth2_m17-32.json).
# Seven CTAs per SM (72 registers) hold twice the CTAs of a shape whose weight-row blocks fill less
# than one wave at 5: 14336x5120 has 448 blocks, one CTA each for 660 slots (4 on 52 SMs, 3 on 80),
# where split 2 gives 896 CTAs for 924 slots at 7 per SM, twice the warps loading at once. ptxas
# (sm_90a) fits one block at depth 4 in 71-72 registers without spills at 1-8 rows, and at depth 2
# at 16 rows (2026-12-02). Not timed yet.
SKINNY_SHAPES = ((1, 4, 4, 5, 1), (1, 4, 8, 5, 1), (1, 4, 8, 6, 1), (2, 4, 4, 3, 1), (1, 4, 4, 7, 1))
# Two blocks per warp at depth 2 and 5 CTAs per SM (96 registers, no spill at 16 rows; the estimate
# says 98): 34816x5120 M = 16 in 34.0 us against 36.3 for the table's two blocks at depth 4 and 3 CTAs
# per SM, its 544 CTAs in one wave of 660 slots instead of 1.37 waves of 396; one block at depth 8 and
# 5 CTAs per SM and two blocks at depth 4 and 4 CTAs per SM, raced beside it, won no cell of the five
# shapes at M = 12 or 16 (H200, 2026-12-01r; results/h200_timings_2026-12-01r_skinny_m12-16_wide_shapes.json).
SKINNY_WIDE_SHAPES = ((1, 4, 4, 4, 1), (1, 4, 4, 5, 1), (1, 4, 8, 4, 1), (2, 4, 4, 3, 1), (2, 4, 2, 5, 1), (1, 4, 2, 7, 1))
# The wgmma form (sm_90, past one n8 tile): (depth, ctas_per_sm, x chunk) for one warpgroup of one
# block per warp, over SKINNY_SPLITS. Raced against the table at M = 24 and 32 on the five default
# shapes and at M = 16 on 34816x5120, 5120x17408 and 14336x5120 (H200, 2026-12-01s;
# results/h200_ab_2026-12-01s_skinny_wgmma.json), it won one cell, 34816x5120 M = 24, where (8, 4, 4)
# at split 4 ran 39.0-40.1 us against 41.5-41.8 in four runs; in the other cells the best wgmma config
# took 1.07-1.34x the table's time. Not offered at 32 rows, where both of these shapes lost on all
# five weight shapes and (4, 5, 2) spills. Not offered, having won no cell: x staged whole or in
# chunks of one k32 block (a barrier and proxy fence per block), two blocks per warp (at most depth 2
# fits 128 registers at 24 rows), two warpgroups per CTA, and two wgmma groups in flight (ptxas
# serialized them, C7512/C7513).
SKINNY_WGMMA_SHAPES = ((8, 4, 4), (4, 5, 2))
SKINNY_WGMMA_MAX_BLOCK_X = 24
# Split 3 fills SMs that powers of two leave empty where K allows it (``fits``): 5120x6144 (192 k32
# blocks) split 3 ran M = 16 in 10.33 us against 10.81 at split 2, and M = 5-8 in 8.81 against 8.89
# at split 4 (H200, 2026-12-01l). Split 5 (K = 5120) is not offered: it lost every cell it was raced
# in, M = 16 on 34816x5120 and 14336x5120 (its exchange of 32 accumulators per thread cost more than
# the fuller waves gave) and M = 1, 4, 8 on the four K = 5120 shapes, at best 1.16x the winner's
# time (results/h200_timings_2026-12-01m_odd_splits_m1-8.json).
SKINNY_SPLITS = (1, 2, 3, 4, 8)
# Staged x costs each CTA a prologue and 64 bytes of shared memory per row and k32 block of its K
# range, which at 8 rows and split 1 (80 KB at K = 5120) holds two CTAs per SM; the warps' rings
# cost a 16-byte copy per lane, n8 tile and block in the loop, and an ldmatrix.
SKINNY_STAGE_X = (True, False)
# ``registers_needed`` is an estimate, and ptxas sometimes fits what it says will not: over 96 ring
# configs of 8-32 rows (one or two blocks per warp, depth 2-8, 3-6 CTAs per SM; the 96 of 128 that
# fit the shared memory) on 34816x5120 (sm_90a, 2026-12-01; NOTES, thirty-third session) it exceeded
# the budget by up to this many registers on configs that compiled without a spill: (32, 2, s, 4, 4,
# 3) by 12, (16, 1, s, 4, 8, 5) by 10, (24, 1, s, 4, 4, 5) by 7; the smallest excess that did spill
# was 2 (4 bytes). So the tuner times every config within this margin and lets the race, not the
# estimate, decide.
SKINNY_REGISTER_SLACK = 12


# x copied in pairs of k32 blocks (``SkinnyConfig.x_pairs``) for the rings past one n8 tile, where
# they took 0.93-0.99x the time at M = 16 on seven of eight shapes; at one tile they took 0.96-1.04x,
# so the tuner does not time them there (H200, 2026-12-03; results/h200_ab_2026-12-03g_x_pairs.json).
def skinny_candidates(m: int, k: int, arch: str) -> list:
    """The skinny kernel's candidates at this M: each shape of ``SKINNY_SHAPES`` (or, past one n8
    tile, ``SKINNY_WIDE_SHAPES`` and on sm_90 up to 24 rows ``SKINNY_WGMMA_SHAPES``) at each split
    (past 1 in both CTA orders, ``split_fastest``), x staged or not, its depth cut to each warp's k32
    blocks and its CTAs per SM to what the shared memory holds, past one n8 tile also with x in pairs
    of blocks where the ring allows, without those whose loop would surely spill (``registers_needed``
    past ``SKINNY_REGISTER_SLACK``; ``candidates`` filters the rest)."""
    block_x = skinny.block_x_for(m)
    shapes = SKINNY_SHAPES if block_x <= skinny.X_TILE_ROWS else SKINNY_WIDE_SHAPES
    out = []
    for (rows, warps, depth, ctas, warps_n), split, stage_x in itertools.product(shapes, SKINNY_SPLITS, SKINNY_STAGE_X):
        config = skinny.SkinnyConfig(block_x, rows, split, warps, depth, ctas, stage_x, warps_n).depth_within(k)
        out.append(config._replace(ctas_per_sm=max(1, min(ctas, config.ctas_held(k, arch)))))
    if arch == "sm_90" and skinny.X_TILE_ROWS < block_x <= SKINNY_WGMMA_MAX_BLOCK_X:
        warps = skinny.WGMMA_WARPS
        for (depth, ctas, chunk), split in itertools.product(SKINNY_WGMMA_SHAPES, SKINNY_SPLITS):
            out.append(skinny.SkinnyConfig(block_x, 1, split, warps, depth, ctas, False, warps, chunk).depth_within(k))
    out += [c._replace(split_fastest=True) for c in out if c.split_k > 1]  # see skinny.build_skinny_kernel
    out += [c._replace(x_pairs=True) for c in out if c.block_x > skinny.X_TILE_ROWS and c.pairs_fit()]  # x_pairs: see above
    return [c for c in out if c.registers_needed() <= c.registers() + SKINNY_REGISTER_SLACK]


# A tail (``SkinnyConfig.tail_tiles``) for the unsplit ring configs whose CTA columns fill no whole
# wave: the columns past the last multiple of the SM count, split in SKINNY_TAIL_SPLITS pieces, split
# fastest. Raced against the table's unsplit configs (H200, 2026-12-03b, one process, 5 rounds;
# results/h200_ab_2026-12-03b_tail_tiles.json): 34816x5120 M = 16 (544 columns of two weight blocks,
# 16 past four waves of 132) in 31.97 us at split 2 against 34.64, 32.6-32.7 at split 4 and 8;
# 14336x5120 M = 16 (448 columns, 52 past three) in 15.61 at split 2 against 17.28; 34816x5120 M = 8
# 28.43 against 29.04 at split 4; but 16384x5120 M = 16 (512 columns, 116 past three: 3.88 per SM
# either way) 18.94-20.31 against 17.03, where the tail only adds an exchange.
SKINNY_TAIL_SPLITS = (2, 4, 8)


def skinny_tail_candidates(configs: list, n: int, sm_count: int) -> list:
    """The ``SKINNY_TAIL_SPLITS`` tails of the unsplit, unstaged mma.sync configs among ``configs``
    whose columns overrun whole waves of ``sm_count`` by some (``candidates`` filters what does not fit)."""
    out = []
    for c in configs:
        if not isinstance(c, skinny.SkinnyConfig) or c.split_k > 1 or c.stage_x or c.wgmma:
            continue
        columns = c.columns(n)
        if columns > sm_count and columns % sm_count:
            out += [c._replace(split_k=split, split_fastest=True, tail_tiles=columns % sm_count) for split in SKINNY_TAIL_SPLITS]
    return out


def ctas_per_sm(config, arch: str) -> int:
    """CTAs of ``config`` that one SM's shared memory holds on ``arch``."""
    return maint.smem_per_sm(arch) // (config.kernel_shape().shared_bytes() + maint.hopper.CTA_RESERVED_SMEM)


def wgmma_candidates(m: int, n: int, k: int, sm_count: int) -> list:
    """The wgmma kernel's candidates at this M (sm_90 only; ``candidates`` filters what does not fit)."""
    hopper = maint.hopper
    tight = hopper.tight_wgmma_config(m, n, k, sm_count=sm_count)
    # The loader follows the x block (``hopper.tma_loads_for``): both loaders for every candidate
    # would double the tuner's time for what one measurement (2026-11-30) already sorted by x block.
    W = lambda bx, stages, split=1, wgs=1, bk=hopper.SWIZZLE_K: hopper.WgmmaConfig(bx, bk, stages, split, hopper.tma_loads_for(bx), wgs)  # noqa: E731
    if m <= WGMMA_SMALL_M:
        blocks = (WGMMA_MIN_BLOCK_X, tight.block_x) if m <= WGMMA_MIN_BLOCK_X else (tight.block_x,)
        out = [W(bx, st, split) for bx in blocks for st in WGMMA_SMALL_STAGES for split in (1, *WGMMA_SPLITS)]
        out += [W(tight.block_x, hopper.DEEP_K_STAGES, split, bk=hopper.DEEP_K) for split in (1, *WGMMA_SPLITS)]  # 128-deep k tiles (hopper.DEEP_K)
        if tight.block_x <= UNEVEN_SPLIT_TMA_MAX_BLOCK_X:  # see UNEVEN_SPLIT_TMA_STAGES
            out += [W(tight.block_x, UNEVEN_SPLIT_TMA_STAGES, split, bk=hopper.DEEP_K)._replace(tma_loads=True) for split in WGMMA_SPLITS]
        split_producer = W(tight.block_x, SPLIT_PRODUCER_STAGES, 1, 2, bk=hopper.DEEP_K)._replace(tma_loads=True, producer=True)
        deepest = hopper.deepest_stages(tight.block_x, ctas_per_sm=1, block_k=hopper.DEEP_K)
        for split in WGMMA_SPLITS:  # the deep one holds at most the split's k tiles
            stages = {SPLIT_PRODUCER_STAGES, TWO_WARPGROUP_STREAMK_STAGES, max(SPLIT_PRODUCER_STAGES, min(deepest, k // hopper.DEEP_K // split))}
            out += [split_producer._replace(split_k=split, stages=st) for st in sorted(stages)]
        stages = min(ONE_WARPGROUP_SPLIT_PRODUCER_STAGES, hopper.deepest_stages(tight.block_x, 2, hopper.DEEP_K))
        one_warpgroup = split_producer._replace(warpgroups=1, stages=stages, a_batches=ONE_WARPGROUP_PRODUCER_A_BATCHES)
        out += [one_warpgroup._replace(split_k=split) for split in WGMMA_SPLITS]
    else:
        out = [tight]
        blocks = tuple(dict.fromkeys(b for b in (tight.block_x, *WGMMA_BLOCK_X) if b < 2 * m))
        for bx in blocks:
            out += [W(bx, st) for st in (*WGMMA_STAGES, hopper.deepest_stages(bx))]
            out += [W(bx, WGMMA_STAGES[0], split) for split in WGMMA_SPLITS]
    for bx in blocks:
        streamk = WGMMA_STREAMK._replace(block_x=bx, tma_loads=hopper.tma_loads_for(bx))
        out.append(streamk)
        deepest = hopper.deepest_stages(bx, streamk.ctas_per_sm, hopper.DEEP_K)
        if deepest >= WGMMA_DEEP_K_MIN_STAGES:
            deep = [streamk._replace(block_k=hopper.DEEP_K, stages=stages) for stages in (WGMMA_STREAMK.stages, deepest)]
            by_tma = [c._replace(tma_loads=True) for c in deep if bx <= TMA_STREAMK_MAX_BLOCK_X]
            out += deep + by_tma + [c._replace(producer=True, a_batches=ONE_WARPGROUP_PRODUCER_A_BATCHES) for c in by_tma]
    if m > TWO_WARPGROUP_MIN_M:
        covers = (hopper.WGMMA_MAX_N, hopper.MAX_BLOCK_X)  # x blocks of one wgmma N, and wider
        for bx in dict.fromkeys(hopper.tight_wgmma_config(m, n, k, sm_count=sm_count, max_block_x=most).block_x for most in covers):
            for bk in (hopper.SWIZZLE_K, hopper.DEEP_K):
                stages = hopper.deepest_stages(bx, ctas_per_sm=1, block_k=bk)
                if bk == hopper.DEEP_K and stages < WGMMA_DEEP_K_MIN_STAGES:
                    continue
                streamk = WGMMA_STREAMK._replace(block_x=bx, block_k=bk, ctas_per_sm=1, tma_loads=True, warpgroups=2)
                depths = {min(WGMMA_STREAMK.stages, stages), stages}
                if bk == hopper.DEEP_K:
                    depths.add(min(TWO_WARPGROUP_STREAMK_STAGES, stages))
                streamks = [streamk._replace(stages=st) for st in sorted(depths)]
                unsplit = W(bx, stages, 1, 2, bk=bk)._replace(tma_loads=True)  # the producer needs TMA, at any x block
                out += [c._replace(producer=producer) for c in (unsplit, *streamks) for producer in (False, True)]
                if m > WGMMA_SMALL_M and bk == hopper.DEEP_K and bx <= SPLIT_PRODUCER_MAX_BLOCK_X:
                    out += [unsplit._replace(producer=True, split_k=split) for split in WGMMA_SPLITS]
    if m > hopper.ONE_WARPGROUP_MAX_BLOCK_X:  # see NARROW_TWO_WARPGROUP_STREAMK
        out.append(NARROW_TWO_WARPGROUP_STREAMK._replace(block_x=tight.block_x))
    for waves in WHOLE_WAVES:  # see hopper.ONE_WAVE_MIN_STAGES and TWO_WAVES_MIN_FILL
        wave = hopper.whole_waves_block_x(m, n, sm_count, waves)
        if m > TWO_WARPGROUP_MIN_M and wave and (waves == 1 or wave >= hopper.ONE_WAVE_MIN_BLOCK_X):
            for bk, min_stages in ((hopper.SWIZZLE_K, hopper.MIN_STAGES), (hopper.DEEP_K, WGMMA_DEEP_K_MIN_STAGES)):
                whole = hopper.whole_tiles_config(wave, k, bk, min_stages)
                out += [whole] if whole else []
    narrow = hopper.tight_wgmma_config(m, n, k, sm_count=sm_count, row_step=hopper.X_BLOCK_STEP).block_x
    if WGMMA_MIN_BLOCK_X < m <= NARROW_TWINS_MAX_M and narrow < tight.block_x:  # see NARROW_TWINS_MAX_M
        out += [c._replace(block_x=narrow) for c in out if c.block_x == tight.block_x]
    fitting = [c for c in out if fits(c, n, k, "sm_90")]
    return out + scale_pair_twins(fitting) + streamk_waves_twins(out, m, n, k, sm_count) + tail_twins(fitting, m, n, k, sm_count)


def scale_pair_twins(configs: list) -> list:
    """The twins of the one-warpgroup producer configs among ``configs`` (two CTAs per SM) with the
    producer's scale pairs, at the deepest pipeline that fits them and one stage shallower, and at
    those depths without pairs where they are shallower than the config's (see SCALE_PAIR_DEPTHS), never
    under ``hopper.SCALE_PAIR_MIN_STAGES``."""
    out = []
    for c in configs:
        if not (isinstance(c, (maint.hopper.WgmmaConfig, maint.WgmmaStreamKConfig)) and c.warpgroups == 1 and c.producer):
            continue
        deepest = min(c.stages, maint.hopper.deepest_stages(c.block_x, 2, c.block_k, scale_pairs=True))
        for stages in range(deepest, max(deepest - SCALE_PAIR_DEPTHS, maint.hopper.SCALE_PAIR_MIN_STAGES - 1), -1):
            out += [c._replace(stages=stages, scale_pairs=True)] + ([c._replace(stages=stages)] if stages < c.stages else [])
    return out


# Tails (``hopper.WgmmaConfig.tail_k_tiles``) for the two-warpgroup split configs, one CTA per SM, that
# leave SMs idle: ``tails_per_cta`` (at least two) tiles' tails on each idle SM, and tails of the length that would
# even the tail CTAs' k tiles with the splits' and of TAIL_LENGTHS - 1 shorter ones. A tail CTA pays
# for each segment it starts and each piece it posts, so the winners ran short of the balance: on
# 5120x17408 (40 tiles, split 3, 10 tail CTAs of 4 tails; even at 10 k tiles) tails of 9 at M = 24
# (20.9 us against 22.0) and 8 at M = 32 (22.1 against 23.0); on 5120x6144 tails of 3 (even at 4) at
# M = 24 and 32 (10.7 against 11.1 at M = 32). H200, 2026-12-03, final races of the tuner's
# --update (results/h200_twins_2026-12-03o_tails.json).
TAIL_LENGTHS = 3


def tail_twins(configs: list, m: int, n: int, k: int, sm_count: int) -> list:
    """The tail twins of the two-warpgroup split configs among ``configs`` (see TAIL_LENGTHS); only
    those ``candidates`` finds to fit (the tails' exchange must be the marked one)."""
    out = []
    for c in configs:
        if not (isinstance(c, maint.hopper.WgmmaConfig) and c.warpgroups == 2 and c.producer and c.split_k > 1 and not c.tail_k_tiles):
            continue
        tiles, idle = n // maint.hopper.CTA_ROWS, sm_count - maint.hopper.wgmma_ctas(c, m, n)
        if -(-m // c.block_x) > 1 or idle < 1:
            continue
        per_cta = -(-tiles // idle)
        if per_cta < 2:  # one tile's tail per CTA is one more split
            continue
        even = round(k // c.block_k / (per_cta * c.split_k + 1))  # tail CTAs' k tiles = a split's
        out += [c._replace(tail_k_tiles=length, tails_per_cta=per_cta) for length in range(max(1, even - TAIL_LENGTHS + 1), even + 1)]
    return out


def ticket_twins(configs: list) -> list:
    """The ticket-exchange twins (``hopper.WgmmaConfig.tickets``) of the split wgmma configs among
    ``configs`` whose exchange would be marked."""
    return [c._replace(tickets=True) for c in configs if isinstance(c, maint.hopper.WgmmaConfig) and c.split_plan.marked]


def streamk_waves_twins(configs: list, m: int, n: int, k: int, sm_count: int) -> list:
    """``STREAMK_WAVES`` twins of the two-warpgroup producer stream-K configs among ``configs``, one
    per distinct stream-K share that leaves whole waves (``maint.streamk_tiles``)."""
    out = []
    for c in configs:
        if not (isinstance(c, maint.WgmmaStreamKConfig) and c.warpgroups == 2 and c.producer and not c.streamk_waves):
            continue
        twins = [c._replace(streamk_waves=w) for w in STREAMK_WAVES]
        shares = {maint.wgmma_streamk_share(m, n, k, t, sm_count): t for t in reversed(twins)}  # one twin per share
        out += [t for (tiles, shared), t in shares.items() if shared < tiles]
    return out


def candidates(m: int, n: int, k: int, arch: str) -> list:
    """Configs worth timing at this M (2-111 on sm_120, 32-188 on sm_90 over the default shapes and
    the benchmark's M, the skinny kernel's included; compiling is the tuner's cost): the dispatch's
    and both heuristics' choices, the fragment kernel over every split with one or two k groups,
    stream-K over the heuristic's tile, on sm_90 the wgmma kernel (``wgmma_candidates``), and at
    M <= 32 the skinny kernel (``skinny_candidates``, ``skinny_tail_candidates``); split wgmma
    configs also with tickets (``ticket_twins``)."""
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    heuristic = nv.get_config(m, n, k, sm_count=sm_count)
    s = heuristic.kernel_shape()
    # What the dispatch runs without a table entry, so the timings always show its distance from the best.
    dispatched = maint.heuristic_config(m, n, k, arch=arch, sm_count=sm_count)
    out = [dispatched, heuristic, maint.get_streamk_config(m, n, k, sm_count=sm_count)]
    if isinstance(heuristic, nv.FragConfig):
        out += [heuristic._replace(split_k=split, warps_k=wk) for split in FRAG_SPLITS for wk in FRAG_WARPS_K]
        if s.block_m == 16:
            out += [heuristic._replace(block_k=FRAG_DEEP_K, stages=FRAG_DEEP_K_STAGES, split_k=split) for split in FRAG_SPLITS]
        if s.block_m == 16 and n // s.block_n < sm_count:
            out += [heuristic._replace(block_n=FRAG_NARROW_N, split_k=split) for split in FRAG_SPLITS]
        if s.block_m == 16 or ctas_per_sm(heuristic, arch) < 2:
            out += [heuristic._replace(block_k=bk, stages=st, split_k=split) for bk, st in FRAG_OCCUPANCY_SHAPES for split in FRAG_SPLITS]
        if s.block_m >= maint.STREAMK_MIN_BLOCK_M:
            out += [maint.StreamKConfig(s.block_m, s.block_n, s.block_k, 1, s.warps_n, s.stages, c) for c in STREAMK_CTAS_PER_SM]
    else:
        out += [heuristic._replace(split_k=2), nv.TileConfig(128, 128, 64, 2, 2, 1, 4)]
    if arch == "sm_90":
        out += wgmma_candidates(m, n, k, sm_count)
    if m <= skinny.MAX_BLOCK_X:
        ring = skinny_candidates(m, k, arch)
        out += ring + skinny_tail_candidates(ring, n, sm_count)
    out += ticket_twins(out)
    return [c for c in dict.fromkeys(out) if fits(c, n, k, arch)]


def race_entrants(m: int, n: int, k: int, arch: str, kinds: Optional[set] = None, twins: Optional[list] = None) -> list:
    """``candidates``, or the dispatch's config today (the table's, else the heuristics') with
    ``twins`` (``--twins``: its copies with some fields changed) or with the candidates of ``kinds``
    (config type names, ``--kinds``: a new kernel family raced against the incumbent), without the
    compiles and timings of every other candidate."""
    if kinds is None and twins is None:
        return candidates(m, n, k, arch)
    incumbent = maint.config_for(m, n, k, torch.device("cuda"))
    if twins is not None:
        return twin_configs(incumbent, twins, n, k, arch)
    return list(dict.fromkeys([incumbent] + [c for c in candidates(m, n, k, arch) if type(c).__name__ in kinds]))


def rotated_weights(n: int, k: int) -> tuple:
    """``(checkpoint tensors, prepared weights)``: enough copies that the rotation outgrows L2."""
    raw = [nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(i)) for i in range(bench.copies_for(bench.weight_bytes(n, k)))]
    return raw, [nv.prepare_nvfp4_weight(*r) for r in raw]


def graph_timer(x: torch.Tensor, weights: list, config) -> nv.GraphTimer:
    """The benchmark's timer for ``config``: one call per rotated weight, each after a separator."""
    separator_buffer = torch.zeros(1, device="cuda")
    calls = [lambda w=w: maint.nvfp4_w4a16_linear(x, w, config) for w in weights]
    return nv.GraphTimer(calls, lambda: separator_buffer.add_(1.0))


def time_configs(x: torch.Tensor, weights: list, configs: list, heat_ms: float = 0.0) -> list:
    """``[(us, config)]``, fastest first: each config's CUDA-graph time over the rotated weights, one
    config at a time (the graphs of up to ~210 candidates would not fit in memory together), each after
    ``heat_ms`` of its own calls (``--sustained``)."""
    return sorted(((graph_timer(x, weights, config).per_call_us(heat_ms=heat_ms), config) for config in configs), key=lambda t: t[0])


# One pass over dozens of candidates is not a fair race at large M: in a tuning of 34816x5120 (H200,
# 2026-11-30) the stream-K twins timed last at M = 1024 took 1.14-1.23x the time they had taken in a
# probe that timed them in pairs (the base config 1.07x), and lost a cell they had won there. The
# fastest FINALISTS are timed again the benchmark's way (``bench.race``: all captured first, then
# FINAL_ROUNDS rounds back to back in rotated order) and ranked by their best round. Until
# 2026-12-01 each round captured its graphs anew, each replayed right after its own capture; that
# race ranked W(352,64,4) last of four at M = 1024 on the N = 5120 shapes (5120x6144: 92.1 us),
# where the benchmark, with two tables in one call, ran it 2-5 % faster than the stream-K config
# the race had picked (84.5 against 89.0 us; NOTES, twenty-third session).
FINALISTS = 4
FINAL_ROUNDS = 3
# Finalists within CLOSE_CALL of the fastest race once more, TIEBREAK_ROUNDS rounds, and rank by that
# race's best round: the best of three rounds once put a config first by 0.05 us on 34816x5120 M = 16
# (34.92 against 34.97) that a 7-round race of the pair put 1.1 us behind (36.26 against 35.15) and
# the benchmark 1.4 us (H200, 2026-12-01; NOTES, thirty-first session).
CLOSE_CALL = 0.01
TIEBREAK_ROUNDS = 7
# A best round more than LUCKY_ROUND faster than the config's median round is not believed; the median
# ranks it. On 34816x5120 M = 16 one round of 29.74 us put a split-2 skinny config first whose first
# timing was 35.62 and which the benchmark ran in 36.09, against 34.12 for the config it displaced
# (H200, 2026-12-01y; NOTES, thirty-ninth session). Drift under load moves rounds 2-5 %, not 10.
LUCKY_ROUND = 0.10


def ranking_us(rounds: list) -> float:
    """A config's time in a race: its best round, or its median where the best is a lucky outlier."""
    best, median = min(rounds), statistics.median(rounds)
    return median if best < median * (1 - LUCKY_ROUND) else best


def final_race(x: torch.Tensor, weights: list, timed: list, heat_ms: float = 0.0) -> list:
    """``[(us, config)]`` of the first pass's fastest ``FINALISTS``, fastest first: each config's best
    of ``FINAL_ROUNDS`` benchmark rounds, or, for those within ``CLOSE_CALL`` of the fastest (ranked
    ahead of the rest), its best of the ``TIEBREAK_ROUNDS`` rounds of a race among them; a lucky best
    round gives way to the median (``ranking_us``)."""
    timers = {config: graph_timer(x, weights, config) for _, config in timed[:FINALISTS]}

    def race(configs, rounds: int) -> list:  # [(ranking_us of its rounds, config)], fastest first
        times = bench.race({config: timers[config] for config in configs}, rounds, heat_ms)
        return sorted(((ranking_us(us), config) for config, us in times.items()), key=lambda t: t[0])

    ranked = race(timers, FINAL_ROUNDS)
    close = [config for us, config in ranked if us <= ranked[0][0] * (1 + CLOSE_CALL)]
    if len(close) < 2:
        return ranked
    return race(close, TIEBREAK_ROUNDS) + ranked[len(close) :]


def matches_reference(x: torch.Tensor, weight, ref: torch.Tensor, config) -> bool:
    """Whether ``config``'s output for ``x`` passes the FP32 reference check against ``ref``."""
    return nv.compare_with_reference(maint.nvfp4_w4a16_linear(x, weight, config), ref)["ok"]


def tune_shape(
    n: int, k: int, ms: list, arch: str, progress: bench.Progress, timings: Optional[list] = None, heat_ms: float = 0.0, **entrants
) -> list:
    """``[(m, winner, us)]`` for each breakpoint, the winner verified against the FP32 reference;
    ``entrants``: ``race_entrants``' ``kinds`` or ``twins``. Every candidate's time goes to
    ``timings`` (rows for ``--timings``) when one is given; every timing follows ``heat_ms`` of the
    same calls."""
    raw, weights = rotated_weights(n, k)
    winners = []
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        timed = time_configs(x, weights, race_entrants(m, n, k, arch, **entrants), heat_ms)
        final = final_race(x, weights, timed, heat_ms)
        if timings is not None:
            final_us = {config: us for us, config in final}
            timings += [{"n": n, "k": k, "m": m, "us": us, **({"final_us": final_us[config]} if config in final_us else {}), **maint.config_to_json(config)}
                        for us, config in timed]
        ref = nv.reference_nvfp4_linear(x, *raw[0])
        for us, config in final + timed[FINALISTS:]:  # the fastest config that also passes the reference check
            if matches_reference(x, weights[0], ref, config):
                winners.append((m, config, us))
                break
        else:
            raise RuntimeError(f"no candidate passed the reference check at {n}x{k} M={m}")
        progress.step(f"{n}x{k} M={m}: {type(winners[-1][1]).__name__} {winners[-1][2]:.1f} us")
    return winners


# --twins: the dispatch's config beside variants of it, each with some fields changed. Each session's
# one-off experiments (128-deep k tiles, more CTAs per SM, a producer warpgroup) were such twins.
def parse_twin(text: str) -> dict:
    """``FIELD=VALUE[,FIELD=VALUE...]`` (VALUE an integer, true or false) as ``{field: value}``."""
    twin = {}
    for part in text.split(","):
        field, sep, value = part.partition("=")
        if not sep or not field.isidentifier():
            raise argparse.ArgumentTypeError(f"--twins: expected FIELD=VALUE, got {part!r}")
        if value.lower() in ("true", "false"):
            twin[field] = value.lower() == "true"
        else:
            try:
                twin[field] = int(value)
            except ValueError:
                raise argparse.ArgumentTypeError(f"--twins: {part!r}: VALUE must be an integer, true or false") from None
    return twin


def twin_configs(base, twins: list, n: int, k: int, arch: str) -> list:
    """``base`` and its twins, base first; a twin whose fields ``base`` lacks, or that does not fit,
    is left out."""
    out = [base] + [base._replace(**twin) for twin in twins if set(twin) <= set(base._fields)]
    return [c for c in dict.fromkeys(out) if fits(c, n, k, arch)]


def time_twins(n: int, k: int, ms: list, twins: list, arch: str, progress: bench.Progress, timings: list, heat_ms: float = 0.0) -> None:
    """For each M: the dispatch's config (the table's, else the heuristics') and its twins, timed side
    by side and each checked against the FP32 reference; one line each on stdout, rows with ``ok`` in
    ``timings``."""
    raw, weights = rotated_weights(n, k)
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        configs = race_entrants(m, n, k, arch, twins=twins)
        times = {c: us for us, c in time_configs(x, weights, configs, heat_ms)}
        ref = nv.reference_nvfp4_linear(x, *raw[0])
        cells = []
        for c in configs:
            ok = matches_reference(x, weights[0], ref, c)
            timings.append({"n": n, "k": k, "m": m, "us": times[c], "ok": ok, **maint.config_to_json(c)})
            cells.append(f"{times[c]:.1f}{'' if ok else ' (WRONG)'} {c}")
        print(f"{n}x{k} M={m}: " + " | ".join(cells), flush=True)
        progress.step(f"{n}x{k} M={m}")


def join_equal_neighbours(entries: list) -> list:
    """One shape's entries, sorted by M: neighbours with the same config and touching M ranges
    become one entry."""
    joined = []
    for e in entries:
        if joined and maint.config_from_json(joined[-1]) == maint.config_from_json(e) and joined[-1]["m_max"] + 1 == e["m_min"]:
            joined[-1] = dict(joined[-1], m_max=e["m_max"])
        else:
            joined.append(e)
    return joined


def entries_from_winners(n: int, k: int, winners: list) -> list:
    """Breakpoint m_i covers (m_{i-1}, m_i], and the last one reaches M = 1024; consecutive
    breakpoints with the same winner share one entry."""
    bounds = [m for m, _, _ in winners[:-1]] + [nv.MAX_M_PER_LAUNCH]
    lows = [1] + [m + 1 for m in bounds[:-1]]
    return join_equal_neighbours(
        [{"n": n, "k": k, "m_min": low, "m_max": high, **maint.config_to_json(config)} for low, high, (_, config, _) in zip(lows, bounds, winners)]
    )


def _covering(entries: list, m: int) -> Optional[dict]:
    """The entry whose M range holds ``m``, if any."""
    return next((e for e in entries if e["m_min"] <= m <= e["m_max"]), None)


def update_entries(old: list, new: list, ms: list) -> list:
    """``--update``: a tuned shape's M ranges are its old ones cut at the breakpoints ``ms``; a range
    that ends at a breakpoint takes that breakpoint's winner (the new entry covering it), any other
    keeps its old config (or takes the new entry where no old one covers it: a new shape). Shapes not
    tuned now stay as they were. So ``--ms 144,...,1024`` re-tunes M > 128 of a table whose entries
    break at 128, ``--ms 1,4,8,16`` re-tunes M <= 16, and a subset of a shape's breakpoints (``--ms
    256,384`` where entries also end at 272 and 304) leaves the ranges between them as they were.
    Shapes keep their place in the table (new ones go last), so a re-tune's diff shows only what changed."""
    shape = lambda e: (e["n"], e["k"])  # noqa: E731
    tuned = {shape(e) for e in new}
    order = list(dict.fromkeys(shape(e) for e in old + new))
    updated = []
    for n, k in order:
        mine = [e for e in old if shape(e) == (n, k)]
        if (n, k) not in tuned:
            updated += mine
            continue
        theirs = [e for e in new if shape(e) == (n, k)]
        ends = sorted({*ms, *(e["m_max"] for e in mine + theirs), *(e["m_min"] - 1 for e in mine if e["m_min"] > 1)})
        pieces = []
        for low, high in zip([0] + ends, ends):
            source = _covering(theirs, high) if high in ms else _covering(mine, high) or _covering(theirs, high)
            pieces.append(dict(source, m_min=low + 1, m_max=high))
        updated += join_equal_neighbours(pieces)
    return updated


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=bench.parse_shapes, default=bench.DEFAULT_SHAPES)
    parser.add_argument("--ms", type=lambda t: [int(v) for v in t.split(",")], default=bench.DEFAULT_MS, help="M breakpoints")
    parser.add_argument("--out", help="table file (default: tuned/<this GPU's key>.json beside this script)")
    parser.add_argument("--update", action="store_true", help="keep the entries of shapes not tuned now, and of tuned shapes the M ranges that end at no breakpoint of --ms")
    parser.add_argument("--timings", help="also write every candidate's time to this JSON file (for heuristics)")
    parser.add_argument(
        "--sustained", action="store_true",
        help=f"time every candidate after {bench.SUSTAINED_HEAT_MS:.0f} ms of its own calls, at the clock a long load runs at (as the benchmark's --sustained)",
    )  # fmt: skip
    parser.add_argument(
        "--twins", type=parse_twin, action="append", metavar="FIELD=VALUE[,...]",
        help="time the dispatch's config at each shape and M beside its twin with these fields changed "
        "(e.g. block_k=128 or producer=true; repeat for more twins) and check each against the reference, writing no table; "
        "with --update, tune with these configs as the only entrants",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", type=lambda t: set(t.split(",")), metavar="KIND[,...]",
        help="race only the candidates of these config kinds (e.g. SkinnyConfig) against the config the dispatch runs today",
    )  # fmt: skip
    args = parser.parse_args(argv)
    unknown = (args.kinds or set()) - {t.__name__ for t in maint.CONFIG_TYPES}
    if unknown:
        parser.error(f"--kinds: unknown config kinds {sorted(unknown)}")
    if args.twins and args.kinds:
        parser.error("--twins and --kinds each choose the entrants: give one")
    if args.twins and args.out and not args.update:
        parser.error("--twins writes a table only with --update")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: a table is measured on the GPU it is for")
    device = torch.device("cuda")
    key, arch = maint.gpu_key(device), nv.device_arch(device)
    path = pathlib.Path(args.out) if args.out else maint.table_path(key)
    ms = sorted(set(args.ms))
    heat_ms = bench.SUSTAINED_HEAT_MS if args.sustained else 0.0
    report_twins = bool(args.twins) and not args.update  # time and check the twins, write no table
    entrants = {"kinds": args.kinds, "twins": args.twins}
    nv.precompile({(n, k, c) for n, k in args.shapes for m in ms for c in race_entrants(m, n, k, arch, **entrants)}, arch, maint.compile_any)
    progress = bench.Progress(len(args.shapes) * len(ms))
    entries, timings = [], [] if args.timings or report_twins else None
    for n, k in args.shapes:
        if report_twins:
            time_twins(n, k, ms, args.twins, arch, progress, timings, heat_ms)
        else:
            entries += entries_from_winners(n, k, tune_shape(n, k, ms, arch, progress, timings, heat_ms, **entrants))
    if args.timings:
        pathlib.Path(args.timings).write_text(json.dumps({"key": key, "timings": timings}, indent=0))
    if report_twins:
        return 0
    if args.update and path.exists():
        entries = update_entries(json.loads(path.read_text())["entries"], entries, ms)
    table = {"key": key, "gpu": torch.cuda.get_device_name(device), "date": datetime.date.today().isoformat(), "entries": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1))
    print(f"wrote {len(entries)} entries for {key} to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
