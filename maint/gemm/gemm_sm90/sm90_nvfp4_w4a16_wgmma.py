"""Hopper path (sm_90a only): NVFP4 W4A16 GEMM on wgmma, with the dequantized weights as the register
operand.

wgmma takes A from registers and B from shared memory, so this kernel computes ``y^T = W x^T``: the
weights are A, dequantized in registers exactly as in the example (same prepared layout, same
``nvfp4_dequant_block``), and the x tile is B. The example's 32x32 block gives a lane the rows
n = 8j + g of its warp's block and, per k16 step, the B registers ``b[4j + 2s + h]``; the m16n8k16 A
fragment of 16 rows (and wgmma's per-warp A fragment, which is the same) is a permutation of those:
rows 16p + {g, g+8} of the block are ``[b[4(2p)+2s], b[4(2p+1)+2s], b[4(2p)+2s+1], b[4(2p+1)+2s+1]]``.
A CTA covers 128 weight rows. One warpgroup takes them as two m64 atoms (warp w: block w); atom
p's row ``16w + 8rh + g`` is weight row ``32w + 16p + 8rh + g``, which the epilogue maps back. Two
warpgroups (``WgmmaConfig.warpgroups``) take one atom each: warp w of warpgroup a dequantizes half
``w % 2`` of block ``2a + w // 2``, and atom a's row ``16w + 8rh + g`` is weight row
``64a + 16w + 8rh + g``. Above 128 x rows that keeps the weights dequantized once per x block (the
accumulators of two atoms would not fit); below, it gives a CTA twice the warps to hide latency.
Above 256 x rows (wgmma's largest N) a warpgroup issues two wgmmas per k16 step from the same A
registers, x rows 0-255 and the rest, into consecutive accumulators. With a producer warpgroup
(``WgmmaConfig.producer``) one more warpgroup only issues the TMA loads, and the consumer
warpgroups meet it at per-stage mbarriers instead of a CTA-wide barrier per k tile
(``wgmma_pipeline``); the heuristic gives it to every two-warpgroup config.
"""

import pathlib
import sys
from typing import NamedTuple, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples" / "gemm_sm120"))

import sm120_nvfp4_w4a16_gemm as example  # noqa: E402

CTA_ROWS = 128  # weight rows per CTA: four 32-row fragment blocks
WGMMA_ATOM_M = 64
ATOMS = CTA_ROWS // WGMMA_ATOM_M  # m64 atoms per CTA: a fragment block holds two
WARPGROUP_THREADS = 128
SWIZZLE_K = 64  # bf16 values per 128-byte swizzled row of the x tile, the wgmma B operand
X_ROW_BYTES = SWIZZLE_K * 2  # one x row of a 64-wide panel
SWIZZLE_128B = 1  # the wgmma descriptor's layout type for 128-byte swizzling
SWIZZLE_ATOM_BYTES = 8 * 128  # eight 128-byte rows: the descriptor's stride between 8-row groups
X_BLOCK_STEP = 8  # x blocks are multiples of 8 rows: wgmma's n step and the x tile's swizzle atom
X_CHUNK = 8  # bf16 values per 16-byte cp.async
WORDS_PER_CHUNK = 4  # int32 words per 16-byte cp.async
# A thread holds (atoms of its warpgroup) x block_x / 2 FP32 accumulators: one warpgroup with both
# atoms up to 128 x rows (128 accumulators), two warpgroups with one atom each up to MAX_BLOCK_X.
# Above wgmma's largest N a warpgroup issues two wgmmas per k16 step from the same A registers, so
# the weights are still dequantized once per x block. 352 rows (176 accumulators) take the lean
# producer's registers (LEAN_PRODUCER_REGISTERS); stream-K stops at WGMMA_STREAMK_MAX_BLOCK_X.
ONE_WARPGROUP_MAX_BLOCK_X = 128
WGMMA_MAX_N = 256
MAX_BLOCK_X = 352
MIN_STAGES = 3  # one stage read by the wgmma in flight, one by the k tile being dequantized, one loading
# With a producer warpgroup (``WgmmaConfig.producer``) setmaxnreg re-divides a CTA's registers: the
# producer, which only waits and issues TMA, keeps PRODUCER_REGISTERS per thread and the consumers
# take the rest of what the CTA was launched with (``consumer_registers``). setmaxnreg.inc waits
# until the CTA's own pool holds the registers it asks for, so asking more than the launch gave
# hangs the kernel (two CTAs per SM of two consumer warpgroups at 104 did, H200 2026-11-30k). The
# launch gives each thread the SM's 64K over the threads of the CTAs per SM, rounded down to the
# allocation step of 8: one CTA of two consumer warpgroups 168 per thread, so 256 x 232 + 128 x 40
# = 384 x 168; two CTAs of one 128, so 128 x 216 + 128 x 40 = 256 x 128. Stream-K's ``ctas_per_sm``
# may ask more CTAs where the operands fit (``producer_ctas_per_sm``).
SM_REGISTERS = 64 * 1024
REGISTER_STEP = 8  # registers per thread are allocated, and setmaxnreg moves them, in steps of 8
PRODUCER_REGISTERS = 40  # stream-K's producer, which walks its segments: ptxas spilled it at 24
# The unsplit and split-K kernel's producer is one loop of barrier waits and TMA issues: ptxas fits
# it, without spills, in 24, the least setmaxnreg takes. Its consumers then get 240 instead of 232,
# which keeps the wgmmas of 352 x rows asynchronous (176 accumulators and 32 A registers; at 232
# ptxas serialized them, C7512). That is one wave of three x blocks at M = 1024 on N = 5120: H200,
# 2026-12-01 (results/h200_timings_2026-12-01_352_rows.json, six rounds), W(352,64,4) 83.8 us on
# 5120x6144 against 89.4 for the table's stream-K, 226.8 against 237.2 on 5120x17408. Since the
# tuner's final race times the benchmark's way, the table takes it at M = 961-1024 of 5120x6144
# (84.3 us in the benchmark of 2026-12-01c, 88.7 for the stream-K config before it).
LEAN_PRODUCER_REGISTERS = 24
DEFAULT_PRODUCER_CTAS_PER_SM = {2: 1, 1: 2}  # by consumer warpgroups
# 32-bit registers a thread gives the wgmma's operands: its accumulators and both halves of the A
# registers (see ``operand_sizes``). Past this ptxas serializes every wgmma (warning C7512): correct,
# but nothing overlaps. One warpgroup with 128-deep k tiles did at 104 x rows (104 + 128), not at 96.
MAX_WGMMA_OPERAND_REGISTERS = 224
# Without a producer, stream-K's ``ctas_per_sm`` CTAs bound each thread's registers
# (``__launch_bounds__``); below ptxas's own 255 the operands must leave BOUNDED_NON_OPERAND_REGISTERS
# of the bound. Three one-warpgroup CTAs per SM get 168: ptxas (sm_90a, 34816x5120) kept 96 and 112
# operand registers asynchronous without spills (158 and 142 registers used) and 128 at exactly the
# bound; four get 128 and it serialized the wgmmas of 80 (C7512). Measured on kernels that ran a
# 128-deep k tile as two 64-deep wgmma batches (NOTES, forty-second and forty-third sessions; the
# ``a_batches`` of today).
BOUNDED_NON_OPERAND_REGISTERS = 56
UNBOUNDED_REGISTERS = 256  # a launch bound from here on leaves ptxas its 255
# More CTAs per SM than DEFAULT_PRODUCER_CTAS_PER_SM (stream-K's ctas_per_sm) fit with a producer
# only where ptxas kept the wgmmas asynchronous, without spills, in what is left for a consumer
# thread. By (consumer warpgroups, CTAs per SM), the most wgmma operand registers:
# - (2, 2): 96 registers a consumer (``consumer_registers(2, 2)``). ptxas (2026-11-30k) kept up to 64
#   (x blocks of up to 64 rows with 64-deep k tiles) and serialized them at 72 (80 rows, or 16 rows
#   with 128-deep k tiles).
# - (1, 3): three CTAs launch with 80 registers a thread; with the lean producer (24, see
#   ``streamk_producer_registers``) a consumer gets 136. ptxas (sm_90a, 34816x5120) kept 32 rows of
#   128-deep k tiles in four A batches (64) asynchronous without spills; with a producer of 40 (120
#   a consumer) it serialized them (C7512). Not every such config is spill-free: 24 rows at 4
#   stages spilled 16-24 bytes (none at 3 and 5, nor 32 rows at 4). 12 consumer warps an SM
#   instead of 8, for a loop ncu found latency-bound; correct, but 1.02-1.05x the time of two CTAs
#   per SM on 34816x5120 at M = 24 and 32 (H200, 2026-12-03n), so the tuner does not offer it.
SHARED_SM_PRODUCER_MAX_OPERANDS = {(2, 2): 64, (1, 3): 64}
# ... and at (2, 2) the operand count is not the whole story: a 128-deep k tile in two batches of two
# k32 blocks had its wgmmas serialized from 16 x rows on (40 operand registers), where four batches
# of one block each stayed asynchronous up to 64 rows (48), and 64-deep tiles in one or two batches
# up to 64 operands (ptxas, sm_90a, 34816x5120, 2026-12-03). There a k tile in batches takes one
# k32 block per batch.
SHARED_SM_PRODUCER_BATCHED_K32 = {(2, 2): 1}
SM90_SMEM_PER_CTA = 227 * 1024
SM90_SMEM_PER_SM = 228 * 1024
CTA_RESERVED_SMEM = 1024  # shared memory the driver keeps per CTA
WGMMA_ARCH = "sm_90a"  # wgmma needs the arch-specific target


SM_PARTITIONS = 4  # sub-partitions (warp schedulers) per SM, each with a quarter of the registers


def registers_per_thread(warps: int, ctas_per_sm: int) -> int:
    """Registers per thread that ``ctas_per_sm`` CTAs of ``warps`` warps leave on an SM
    (``__launch_bounds__``), in steps of REGISTER_STEP. The SM deals its warps to its sub-partitions,
    so the fullest one decides: nine 2-warp CTAs (18 warps) get 96, as 20 warps would, not the 112
    of the whole file over 18 warps (ptxas -v, sm_90a). Whole warpgroups fill them evenly."""
    warps_per_partition = -(-ctas_per_sm * warps // SM_PARTITIONS)
    per_thread = SM_REGISTERS // SM_PARTITIONS // (warps_per_partition * 32)
    return per_thread // REGISTER_STEP * REGISTER_STEP


def launch_registers(warpgroups: int, ctas_per_sm: int) -> int:
    """Registers per thread a CTA of ``warpgroups`` consumer warpgroups and a producer launches
    with, ``ctas_per_sm`` of them per SM (``__launch_bounds__``)."""
    return registers_per_thread(WARPGROUP_THREADS // 32 * (warpgroups + 1), ctas_per_sm)


def bounded_registers(warpgroups: int, ctas_per_sm: int) -> Optional[int]:
    """Registers per thread that ``ctas_per_sm`` CTAs of ``warpgroups`` warpgroups and no producer
    launch with (``__launch_bounds__``), or None where that leaves ptxas its own 255."""
    bound = registers_per_thread(WARPGROUP_THREADS // 32 * warpgroups, ctas_per_sm)
    return bound if bound < UNBOUNDED_REGISTERS else None


def consumer_registers(warpgroups: int, ctas_per_sm: int, producer_registers: int = PRODUCER_REGISTERS) -> int:
    """What setmaxnreg gives a consumer thread: the CTA's launch pool less the producer's share,
    in steps of REGISTER_STEP."""
    pool = launch_registers(warpgroups, ctas_per_sm) * WARPGROUP_THREADS * (warpgroups + 1)
    per_thread = (pool - WARPGROUP_THREADS * producer_registers) // (WARPGROUP_THREADS * warpgroups)
    return per_thread // REGISTER_STEP * REGISTER_STEP


def producer_ctas_per_sm(warpgroups: int, ctas_per_sm: int = 1) -> int:
    """The CTAs per SM a kernel with a producer warpgroup launches for (its registers follow): the
    default for its consumer warpgroups, or more where a stream-K config asks (see
    SHARED_SM_PRODUCER_MAX_OPERANDS)."""
    return max(ctas_per_sm, DEFAULT_PRODUCER_CTAS_PER_SM[warpgroups])


def streamk_producer_registers(warpgroups: int, ctas_per_sm: int) -> int:
    """What stream-K's producer keeps: PRODUCER_REGISTERS, or the lean producer's where three CTAs of
    one consumer warpgroup share an SM and a consumer needs every register it can get (there the
    producer fits in 24 without spills, ptxas sm_90a, where at one or two CTAs it spilled)."""
    if (warpgroups, producer_ctas_per_sm(warpgroups, ctas_per_sm)) == (1, 3):
        return LEAN_PRODUCER_REGISTERS
    return PRODUCER_REGISTERS


def x_swizzled(r, c):
    """Column ``c`` of row ``r`` in an x tile: 16-byte chunks XOR-ed with ``r % 8``. For 128-byte
    rows this is the 128-byte swizzle wgmma's descriptor expects; in the stream-K kernel's tiles it
    puts the eight rows one ldmatrix phase reads in eight different bank groups."""
    return (c // X_CHUNK ^ r % 8) * X_CHUNK + c % X_CHUNK


def x_tile_loader(x_rows: int, block_k: int, threads: int):
    """The x half of this kernel's and the stream-K kernel's stage loaders, as a macro:
    ``load(x, x_tiles, stage, x_row0, kt, m, tx)`` issues the cp.async of x rows ``x_row0 ..`` of k
    tile ``kt`` into ``stage``, laid out by ``x_swizzled``; rows at or past ``m`` are zero-filled (a
    predicated cp.async reads nothing). The caller commits the group."""
    import tilelang.language as T

    chunks, chunks_per_row = x_rows * block_k // X_CHUNK, block_k // X_CHUNK

    @T.macro
    def load(x, x_tiles, stage, x_row0, kt, m, tx):
        for c in T.unroll(T.ceildiv(chunks, threads)):
            if c * threads + tx < chunks:
                r = (c * threads + tx) // chunks_per_row
                col = (c * threads + tx) % chunks_per_row * X_CHUNK
                T.ptx_cp_async(
                    T.access_ptr(x_tiles[stage, r, x_swizzled(r, col)], "w", extent=X_CHUNK),
                    T.access_ptr(x[x_row0 + r, kt * block_k + col], "r", extent=X_CHUNK),
                    X_CHUNK,
                    x_row0 + r < m,
                )

    return load


@example.config_type
class WgmmaConfig(NamedTuple):
    """``block_x`` rows of x per CTA (the wgmma N: a multiple of 8; at most 128 on one warpgroup and
    ``MAX_BLOCK_X`` on two, so the accumulators fit), ``block_k`` = 64 or 128 (one or two 64-wide x
    panels of 128-byte swizzled rows per stage), ``stages`` shared-memory stages (at least 3: see
    ``wgmma_pipeline``), ``split_k`` CTAs per output tile (grid.y, reduced as in the example; it
    need not divide the k tiles: ``split_k_tiles``), ``tma_loads``: load the stages by TMA instead
    of cp.async (see ``wgmma_pipeline``),
    ``warpgroups``: 1, or 2 with one m64 atom each (see the module docstring; needed above 128 x
    rows), ``producer``: one more warpgroup issues the TMA
    loads and the consumer warpgroups release stages through mbarriers, with no CTA-wide barrier
    per k tile (see ``wgmma_pipeline``; needs ``tma_loads``). It pays with two
    consumer warpgroups (``TWO_WARPGROUP_PRODUCER``) and lost with one. ``tickets``: a split's
    tiles meet through the example's ticket exchange even where its marked one fits
    (``example.split_k_exchange``). Neither won everywhere (H200, 2026-12-03, the tuned and
    untuned split configs of 24-48 rows, one process, two runs each; results/h200_ab_2026-12-03b_wgmma_ticket.json
    in maint/gemm/gemm_sm120): tickets took 0.97-0.98x the time on 5120x17408 at M = 17 and 24
    (24 rows, split 3) and 0.96x on 4096x4096 at M = 32 (split 4), marked 0.93-0.95x on 6144x4096
    at M = 24-48 (split 2) and 5120x6144 at M = 40, so the tuner races both. ``a_batches``: a
    k tile's wgmmas go in this many commit batches (1, 2 or 4 at 128-deep k tiles), so the A
    registers hold two batches instead of two k tiles (see ``wgmma_pipeline``). It pays where the
    registers are short (``WgmmaStreamKConfig``); on the two-warpgroup producer configs of the H200
    table at M = 24 and 32 it took 1.01-1.07x the time (results/h200_update_2026-12-03j_a_batches_two_warpgroups.json
    in maint/gemm/gemm_sm120). ``tail_k_tiles`` (0: none): each tile's last k tiles are not split
    but run by tail CTAs, ``tails_per_cta`` tiles' tails each (``tail_ctas``), so that split-K over
    few tiles fills the SMs it would leave idle; needs the marked exchange."""

    block_x: int = 64
    block_k: int = SWIZZLE_K
    stages: int = 4
    split_k: int = 1
    tma_loads: bool = False
    warpgroups: int = 1
    producer: bool = False
    tickets: bool = False
    a_batches: int = 1
    scale_pairs: bool = False
    tail_k_tiles: int = 0
    tails_per_cta: int = 1

    SHARED_BYTES_PER_CTA = SM90_SMEM_PER_CTA  # the example's checks use this arch's limit, not sm_120's
    FIELD_MINIMUMS = {"tail_k_tiles": 0}  # 0: no tails
    UNEVEN_SPLIT_K = True  # ... and let split_k leave a remainder of k tiles (``split_k_tiles``)
    MAX_ACCUMULATORS = MAX_BLOCK_X // 2  # ... and two warpgroups' one atom of up to MAX_BLOCK_X columns

    @property
    def BLOCK_M_STEP(self) -> int:  # noqa: N802 (the example's checks read this name)
        """The example's checks ask ``block_m`` for multiples of this times ``warps_m``, which two
        warpgroups are in ``kernel_shape``. Yet both warpgroups take the whole x block (each one
        m64 atom of weight rows): an x block is one wgmma N, so X_BLOCK_STEP rows whatever the
        warpgroups."""
        return max(1, X_BLOCK_STEP // self.warpgroups)

    @property
    def split_plan(self) -> example.SplitPlan:
        """How the split tiles meet (``example.SplitPlan``): ``block_x`` rows, the consumer threads'
        accumulators (``operand_sizes``), ``tickets``."""
        pieces = self.split_k + (self.tail_k_tiles > 0)  # a tile's splits and its tail
        return example.SplitPlan(pieces, self.block_x, operand_sizes(self.block_x, self.block_k, self.warpgroups)[1], self.tickets)

    def kernel_shape(self) -> example.KernelShape:
        """The example's shape view (its checks: divisibility, shared memory, accumulators, split);
        two warpgroups are its ``warps_m = 2``."""
        return example.KernelShape(
            self.block_x, CTA_ROWS, self.block_k, self.warpgroups, CTA_ROWS // example.FRAG_N, self.stages, self.split_k
        )


def shared_bytes(config) -> int:
    """A CTA's shared memory for the stages: the example's count, plus with ``scale_pairs`` the pairs
    (two 4-byte pairs per scale word: twice the scale bytes)."""
    pairs = 2 * config.stages * CTA_ROWS * config.block_k // example.SCALE_BLOCK if config.scale_pairs else 0
    return config.kernel_shape().shared_bytes() + pairs


# Besides its stages a CTA holds its mbarriers (8 bytes each: with TMA loads a ``full`` per stage,
# with a producer an ``empty`` too, with scale pairs a second ``full``) and a few scalars (stream-K's
# segment, split-K's ticket: TileLang 0.1.15 put 16 bytes in the dynamic buffer). They count where
# CTAs share an SM: three 24-row CTAs of five 128-deep stages hold 76800 bytes of stages each, a
# third of 228 KB less the driver's 1 KB to the byte; with their 96 bytes more only two fit, and the
# persistent grid of three per SM ran in one and a half waves (H200, 2026-12-03: 50.3 us against
# 36.4 at four stages on 34816x5120 M = 24).
MBARRIER_BYTES = 8
CTA_SCALAR_SMEM = 64  # the scalars' bytes, rounded up


def cta_smem(config) -> int:
    """What one CTA of ``config`` (a wgmma kernel's) takes of its SM's shared memory: the stages
    (``shared_bytes``), the barriers and scalars, and the driver's reserve."""
    barriers = config.stages * (1 + config.producer + config.scale_pairs) if config.tma_loads else 0
    return shared_bytes(config) + MBARRIER_BYTES * barriers + CTA_SCALAR_SMEM + CTA_RESERVED_SMEM


def operand_sizes(block_x: int, block_k: int, warpgroups: int, a_batches: int = 1) -> tuple:
    """``(a_size, acc_size)`` per thread: bf16 A values of one of a k tile's ``a_batches`` wgmma
    batches ([k16 step][m64 atom][4 registers]; the kernel keeps two such halves) and FP32
    accumulators (per atom of its warpgroup, block_x / 8 column groups of 4)."""
    atoms = ATOMS // warpgroups
    return block_k // 16 // a_batches * atoms * 8, atoms * block_x // 2


def min_warpgroups(block_x: int) -> int:
    """The warpgroups an x block needs: two above ``ONE_WARPGROUP_MAX_BLOCK_X`` rows."""
    return 1 if block_x <= ONE_WARPGROUP_MAX_BLOCK_X else 2


def warp_words(warp, warpgroups: int):
    """``(block, part)``: warp ``warp`` of the CTA dequantizes words ``2 * part ..`` (all four with one
    warpgroup, two with two) of every lane's slice of fragment block ``block``."""
    return warp // warpgroups, warp % warpgroups


# At M <= 16 on shapes whose weight tiles (N / 128) load the SMs unevenly, the heuristic takes this
# kernel from M = 1 with 16-row x blocks and doubles the split until the CTAs spread evenly. The
# fragment kernel evens its split too (the example's ``_evening_split``), but only to M = 8, where
# its partials stay small; at M = 1-8 the two ran within 6 % of each other, each ahead in some
# cells, and at M = 16 this kernel won. H200, 2026-11-30g, the unsplit fragment kernel before /
# this (us, M = 1, 8, 16): 11008x4096 (86 tiles) 15.2 / 13.6, 16.0 / 14.4, 16.5 / 15.8 (split 4;
# Marlin 15.9 at M = 8); 34816x5120 (272 tiles) 42.8 / 36.9, 43.6 / 39.7, 45.1 / 44.1. Wider x
# blocks lost with it (34816x5120 M = 24 and 32, 32-row blocks: split 4 57.3 us against 51.1 for
# split 2), so it stops at 16 rows. The same doubling took 5120x17408 (40 tiles) at M = 5-16 from
# split 4 to 8: 28.9 and 29.8 us against 26.6 and 29.1 at M = 8 and 16. It stops at split 8, the
# largest the tuner times.
UNEVEN_SPLIT_MAX_BLOCK_X = 16
UNEVEN_MAX_SPLIT = 8


DEFAULT_STAGES = 4
# From M = 17 the tuned H200 table (2026-11-30) took this kernel in every shape, over the fragment
# kernel; at M <= 16 the two traded cells. Where the weight tiles give at most half of the SMs a CTA
# (small N), it wins from M = 5 with the split of SMALL_M below: at M = 8 (H200, 2026-11-30) 9.4 us
# against the fragment kernel's 9.8 at 4096x4096, 11.6 against 12.8 at 6144x4096 (Marlin: 9.6 and
# 12.0), and the tuned table takes it at M = 5-16 on both N = 5120 shapes. At M <= 4 the fragment
# kernel's 16-row tile wastes no more than a 16-row x block and kept every cell against Marlin.
HEURISTIC_MIN_M = 17
SMALL_N_MIN_M = 5


def heuristic_min_m(n: int, sm_count: int) -> int:
    """The smallest M the heuristic gives this kernel (see ``HEURISTIC_MIN_M`` and ``UNEVEN_SPLIT_MAX_BLOCK_X``)."""
    if 2 * (n // CTA_ROWS) <= sm_count:
        return SMALL_N_MIN_M
    return 1 if example.loads_sms_unevenly(n // CTA_ROWS, sm_count) else HEURISTIC_MIN_M


# Below SMALL_M the x block is small and a CTA light: the split doubles while the CTAs fit two per SM
# and each split keeps MIN_K_TILES_PER_SPLIT k tiles (4096x4096 M = 32: split 4, 16 k tiles each,
# 11.6 us; split 8, 8 each, 18.1), and x blocks of up to DEEP_STAGES_MAX_BLOCK_X rows take
# DEEP_STAGES (16384x5120 M = 32: 24.9 us against 25.9 with 4; 48-row blocks gained nothing and lost
# 14 % at 34816x5120 M = 40). Against the previous rule (a split towards one CTA per SM, 4 stages),
# over the 44 cells at M = 17-63 of one H200 tuning run (2026-11-30, seven shapes; in-sample, the
# rule was read off those timings): 1.09x faster on geometric mean, never more than 1.1 % slower.
SMALL_M = 64
SMALL_M_CTAS_PER_SM = 2
MIN_K_TILES_PER_SPLIT = 16
DEEP_STAGES = 8
DEEP_STAGES_MAX_BLOCK_X = 32
# Those deep-staged blocks take 128-deep k tiles where their CTAs fit two per SM: per 256 k a warp
# issues 752 SASS instructions against 848 for two 64-deep tiles (the barrier, fence, wait and load
# issue come once per 128 k), and DEEP_K_STAGES keep 384 k in flight as 8 stages of 64 do. H200
# tuner timings (2026-11-30f, M = 24 and 32, 32-row blocks, 128-deep against 64-deep with 8
# stages): 1.01-1.14x faster in all 24 cells of up to 264 CTAs (four shapes, splits 1-6), but
# 0.93-0.96x at 34816x5120 (272 and 544 CTAs) and 0.85-0.95x with a split of 8 (320-2176 CTAs).
# Twins of the heuristic's own configs on the shapes without table entries: 4096x4096 M = 8-32,
# 8.6-10.4 us against 9.4-10.8; 11008x4096 M = 24 and 32, 19.0 and 19.7 against 20.3 and 21.2.
# 48-row blocks gained nothing.
DEEP_K = 2 * SWIZZLE_K
DEEP_K_STAGES = 5
NARROW_BLOCK_X = 64  # the x block that gives small-N shapes more CTAs (the 2026-11-29 heuristic's)
# TMA loads from this x block on. H200, 2026-11-30, TMA against cp.async (us): 128-row blocks
# 239.9 / 263.3 (16384x5120 M = 1024) and 45.1 / 50.2 (5120x6144 M = 256); smaller blocks lost:
# 40.0 / 35.8 (64 rows, split 4), 18.7 / 16.8 (80 rows), 29.1 / 24.7 (16 rows, 14336x5120 M = 16).
TMA_BLOCK_X = 128


def tma_loads_for(block_x: int) -> bool:
    """The loader the heuristic and the tuner give an x block (see ``TMA_BLOCK_X``)."""
    return block_x >= TMA_BLOCK_X


# A TMA config whose CTAs all find an SM of their own takes this many stages: one thread issues its
# loads and no second CTA hides their latency. H200, 2026-11-30, 6 stages against 4 (us): 39.0 /
# 44.0 (14336x5120 M = 128), 38.9 / 44.4 (16384x5120 M = 128), 45.1 / 48.6 (5120x6144 M = 384),
# 119.1 / 131.0 (5120x17408 M = 384); cp.async configs there gained nothing (within 3 %).
LONE_CTA_TMA_STAGES = 6


def deepest_stages(block_x: int, ctas_per_sm: int = 2, block_k: int = SWIZZLE_K, scale_pairs: bool = False) -> int:
    """The most stages with which ``ctas_per_sm`` CTAs of this x block (with ``scale_pairs``, their
    pairs too) still share an SM. The loads run ``stages - 2`` k tiles ahead, so this is the most
    bytes in flight without losing the second CTA, whose dequant overlaps the first one's wgmma
    (6 stages of 128 rows keep one: 356 us against 271 at 16384x5120 M = 1024). Counted with a
    producer's barriers, the most any loader has (``cta_smem``)."""
    one = WgmmaConfig(block_x, block_k, 1, tma_loads=True, producer=True, scale_pairs=scale_pairs)
    per_stage = cta_smem(one._replace(stages=2)) - cta_smem(one)
    return (SM90_SMEM_PER_SM // ctas_per_sm - (cta_smem(one) - per_stage)) // per_stage


def _tiles(m: int, n: int, block_x: int) -> int:
    """Output tiles: weight-row tiles times ``ceil(M / block_x)`` x blocks."""
    return n // CTA_ROWS * -(-m // block_x)


def _x_blocked(m: int, n: int, k: int, block_x: int, sm_count: int) -> WgmmaConfig:
    """``ceil(M / block_x)`` x blocks of ``block_x`` rows, split-K as in the example's heuristic
    (towards two CTAs per SM)."""
    split = example._split_k(_tiles(m, n, block_x), m, n, k, SWIZZLE_K, DEFAULT_STAGES, 2 * sm_count, sm_count)
    return WgmmaConfig(block_x, SWIZZLE_K, DEFAULT_STAGES, split, tma_loads_for(block_x), min_warpgroups(block_x))


# Powers of two leave some shapes' CTAs uneven where three quarters of the split would not: 5120x6144
# (40 tiles, 96 k tiles) gives 160 CTAs at split 4 for 132 SMs (the busiest SM holds 1.65x the mean)
# and 120 at split 3 (1.1x). H200 tuner timings (2026-11-30f and g), split 3 against 4 on 5120x6144,
# us: M = 8 12.0 / 13.5, 16 12.4 / 14.3, 24 13.9 / 16.5, 32 14.3 / 17.5, 48 18.2 / 20.9. Of the
# measured shapes only K = 6144 (96 k tiles) has the factor 3.
def _evened_split(tiles: int, k_tiles: int, split: int, sm_count: int) -> int:
    """``split``, or three quarters of it (3 for 4, 6 for 8) where ``split`` loads the SMs unevenly
    and that does not, divides the k tiles and keeps ``MIN_K_TILES_PER_SPLIT`` each."""
    three_quarters = split // 4 * 3
    if (
        split % 4 == 0
        and example.loads_sms_unevenly(tiles * split, sm_count)
        and not example.loads_sms_unevenly(tiles * three_quarters, sm_count)
        and k_tiles % three_quarters == 0
        and k_tiles // three_quarters >= MIN_K_TILES_PER_SPLIT
    ):
        return three_quarters
    return split


def _small_m_config(n: int, k: int, block_x: int, sm_count: int) -> WgmmaConfig:
    """One x block below ``SMALL_M``: the split, stages and k depth described at ``SMALL_M``, the
    split of x blocks of up to 16 rows as at ``UNEVEN_SPLIT_MAX_BLOCK_X``, evened by ``_evened_split``."""
    tiles, k_tiles, split = n // CTA_ROWS, k // SWIZZLE_K, 1

    def uneven(split: int) -> bool:  # see UNEVEN_SPLIT_MAX_BLOCK_X
        return block_x <= UNEVEN_SPLIT_MAX_BLOCK_X and split < UNEVEN_MAX_SPLIT and example.loads_sms_unevenly(tiles * split, sm_count)

    while (
        (tiles * split * 2 <= SMALL_M_CTAS_PER_SM * sm_count or uneven(split))
        and k_tiles % (split * 2) == 0
        and k_tiles // (split * 2) >= MIN_K_TILES_PER_SPLIT
        and split * 2 <= example.MAX_SPLIT_K
    ):
        split *= 2
    split = _evened_split(tiles, k_tiles, split, sm_count)
    if block_x > DEEP_STAGES_MAX_BLOCK_X:
        return WgmmaConfig(block_x, SWIZZLE_K, min(DEFAULT_STAGES, k_tiles // split), split)
    deep_k_tiles = k // DEEP_K // split if k % (DEEP_K * split) == 0 else 0
    if tiles * split <= SMALL_M_CTAS_PER_SM * sm_count and deep_k_tiles >= DEEP_K_STAGES:
        return WgmmaConfig(block_x, DEEP_K, DEEP_K_STAGES, split)
    return WgmmaConfig(block_x, SWIZZLE_K, min(DEEP_STAGES, k_tiles // split), split)


def wgmma_ctas(config: WgmmaConfig, m: int, n: int) -> int:
    """The split-K kernel's CTAs at this M: output tiles times the split, and the tail CTAs."""
    return _tiles(m, n, config.block_x) * config.split_k + -(-m // config.block_x) * tail_ctas(config, n)


# Split-K over few tiles leaves SMs idle: 5120x17408 has 40 tiles of 128 rows, so split 3 runs 120
# CTAs on the H200's 132 SMs. With ``WgmmaConfig.tail_k_tiles`` the splits share each tile's k tiles
# but its last ``tail_k_tiles``, and ``tails_per_cta`` tiles' tails go to each of a few more CTAs,
# which fill the idle SMs: 3 x 40 CTAs of 42-43 k tiles and 10 of four tails of 8-9 (the table's),
# where split 3 alone gives each CTA 45 or 46. A tail CTA runs its tails as segments, one after the other (its
# stages' ring runs on, as in stream-K), and each tail is its tile's piece 0 in the split's exchange.
# Tails take the marked exchange (``check_wgmma_config``): through the ticket exchange every piece's
# CTA waits for its ticket's round trip, and a tail CTA does so once per tail. 5120x17408 M = 17 (24
# rows, tickets) took 25.6 us with tails of 10 k tiles against 20.8 without, 5120x6144 M = 40-64 (the
# ticket form at 4 pieces) 1.36-1.47x the time; the marked form's posts do not wait. H200,
# 2026-12-03 (results/h200_twins_2026-12-03o_tails.json in maint/gemm/gemm_sm120).
def tail_ctas(config: WgmmaConfig, n: int) -> int:
    """The CTAs that run the tiles' tails: ``tails_per_cta`` tiles' each; 0 without tails."""
    return -(-(n // CTA_ROWS) // config.tails_per_cta) if config.tail_k_tiles else 0


def tail_pieces(config: WgmmaConfig, n: int, cta, minimum=min) -> tuple:
    """``(first tile, tiles)``: the consecutive weight tiles whose tails tail CTA ``cta`` runs (the
    last CTA's may be fewer); ``minimum`` is ``T.min`` in a kernel."""
    first = cta * config.tails_per_cta
    return first, minimum(config.tails_per_cta, n // CTA_ROWS - first)


# The heuristic's x blocks grow in 16-row steps, as they did when it was tuned. Any X_BLOCK_STEP rows
# run (one or two warpgroups), and the tuner offers those blocks too.
TIGHT_ROW_STEP = 16


def x_block_rows(m: int, x_blocks: int, row_step: int = X_BLOCK_STEP) -> int:
    """The x block, a multiple of ``row_step``, that cuts M into ``x_blocks`` blocks."""
    return row_step * -(-m // (row_step * x_blocks))


def tight_wgmma_config(
    m: int, n: int, k: int, *, sm_count: int = 132, max_block_x: int = ONE_WARPGROUP_MAX_BLOCK_X, row_step: int = TIGHT_ROW_STEP
) -> WgmmaConfig:
    """The weights are dequantized once per x block, so: the fewest x blocks of at most
    ``max_block_x`` rows that cover M, each as small as that allows (a multiple of ``row_step``);
    split-K as in the example's heuristic where the tiles would leave half of the SMs idle, or below
    ``SMALL_M`` as described there. K must hold ``DEFAULT_STAGES`` k tiles. Two warpgroups (up to
    ``MAX_BLOCK_X``) are the caller's choice (``takes_two_warpgroups``)."""
    m = min(m, example.MAX_M_PER_LAUNCH)
    x_blocks = -(-m // max_block_x)
    block_x = x_block_rows(m, x_blocks, row_step)
    return _small_m_config(n, k, block_x, sm_count) if m < SMALL_M else _x_blocked(m, n, k, block_x, sm_count)


def get_wgmma_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The sm_90 heuristic for shapes without a tuned entry: None below ``heuristic_min_m`` rows, or
    when K is shorter than ``DEFAULT_STAGES`` k tiles (the other kernels take those). Up to
    ``SPLIT_WAVE_MAX_M`` rows, one wave of split tiles where it applies
    (``split_wave_config``). TMA configs whose CTAs each get an SM take ``LONE_CTA_TMA_STAGES``.

    The tight x blocks (``tight_wgmma_config``): M = 72 runs as one 80-row block, not two 64-row
    ones (H200, 2026-11-30: 11008x4096 27.8 us against 37.2). Where even split they give fewer than
    half of the SMs a CTA (small N), 64-row blocks, which give more CTAs (4096x4096 M = 128: 22.1 us
    against 33.8 for one 128-row block split twice); and where the tight block needs a split to
    reach as many CTAs as the 64-row blocks give, those too: the split-K exchange cost more than the
    second dequant (6144x4096 M = 128: 26.9 us against 33.7; 5120x6144: 38.8 against 41.4; the only
    two cells of the 2026-11-30 timings where this part of the rule decides)."""
    if m < heuristic_min_m(n, sm_count) or k // SWIZZLE_K < DEFAULT_STAGES:
        return None
    m = min(m, example.MAX_M_PER_LAUNCH)
    split_wave = split_wave_config(m, n, k, sm_count=sm_count)
    if split_wave is not None:
        return split_wave
    if takes_two_warpgroups(m, n, k, sm_count):
        return _two_warpgroup_config(m, n, k, sm_count)
    config = _x_blocks_for(m, n, k, sm_count)
    if config.tma_loads and wgmma_ctas(config, m, n) <= sm_count:
        config = config._replace(stages=min(LONE_CTA_TMA_STAGES, k // SWIZZLE_K // config.split_k))
    return config


# From M = 64 (SMALL_M), the dispatch (the stream-K module's ``heuristic_config``) runs the wgmma
# kernel as stream-K where the split-K kernel's CTAs would load the SMs unevenly: the busiest SM,
# CTAs dealt round-robin (``example.sm_imbalance``), holding at least this many times the mean. Over
# the 146 cells at M >= 17 of the H200 timings of 2026-11-30 (seven shapes; in-sample) this took 43
# cells to stream-K and was 1.06x faster on geometric mean than the split-K choice alone; the worst
# cell was 5.7 % slower (5120x6144 M = 544, 200 CTAs), the best 1.83x faster (5120x17408 M = 128,
# 320 CTAs). Under 1.2 it lost more than it won; below M = 64 the dispatch asks more (the stream-K
# module's SMALL_M_STREAMK_MIN_IMBALANCE). The two-warpgroup rule below uses it too. (The M <= 16
# split rules use the example's ``loads_sms_unevenly``, also at 1.2.)
WGMMA_STREAMK_MIN_IMBALANCE = 1.2


# Two warpgroups above 128 x rows: one x block of up to 256 rows dequantizes the weights once where
# blocks of 128 rows or less dequantize them twice or more. Beyond 256 rows the heuristic keeps one
# warpgroup where that takes full 128-row blocks (TMA loads, no padding) unless two warpgroups' tiles
# spread evenly over the SMs (``two_warpgroup_tiles_load_sms_unevenly``). Where they spread evenly,
# two warpgroups beat one warpgroup's 128-row blocks in all 15 cells timed since the producer
# warpgroup and the staged store, by 4-26 % (H200, 2026-11-30s, results/h200_timings_2026-11-30s_
# two_warpgroups_m256-1024.json: 4096x11008 M = 832 89.9 us against 121.8, 34816x5120 M = 1024 486.8
# against 538.9; before both they had lost 6-20 %, 2026-11-30e). Where they do not, the dispatch runs
# them as stream-K, which lost 9 of the 11 cells timed to what it makes of one warpgroup's blocks (by
# up to 16 %: 4096x4096 M = 512, 37.2 against 32.1) and won 2 by 8 % (M = 512 on 11008x4096 and
# 4096x11008; same timings); where one warpgroup's blocks run past one wave, later races say otherwise
# (ONE_WARPGROUP_MAX_WAVES below). The config is the tight x block, no
# split, the deepest pipeline that one CTA per SM holds (registers allow no second); the dispatch
# turns it into stream-K where its CTAs load the SMs unevenly. On the 75 cells at M = 144-1024 of
# the H200 tuner timings (2026-11-30e, five shapes, before the producer warpgroup; in-sample): 1.016x
# the tuner's best on geometric mean, worst 1.14x (34816x5120 M = 544), against 1.076x, worst 1.29x,
# for one warpgroup alone; 1.014x on the 55 of them that the even-tiles clause leaves alone.
# The heuristic's x blocks stay within one wgmma N. The wider ones (two wgmmas per k16 step) won
# 13-21 % at M = 272 and 304 where N >= 14336 gives 112 or more weight tiles (H200, 2026-11-30f:
# 16384x5120 M = 272, 74.8 us against 84.0), but took twice as long at 5120x6144 (40 tiles: 86.0
# against 42.3); no shape without a table entry has measured them, so only the tuner offers them.
HEURISTIC_MAX_BLOCK_X = WGMMA_MAX_N


# Two exceptions keep one warpgroup; both were read off the shapes without table entries (H200,
# 2026-11-30f untuned run against the 2026-11-30e one, ours over cuBLAS of each run), so they are
# fitted to those cells and change none of the 75 tuner cells above:
# - Under TWO_WARPGROUP_MIN_K_TILES_PER_SM k tiles of work per SM the stream-K fix-up of the few,
#   large tiles costs more than the second dequant saves: 4096x4096 M = 144-256 (32 tiles, K = 4096:
#   15.5 per SM) lost 3-15 %; 6144x4096 (23 per SM) and 4096x11008 (42) gained up to 49 %.
# - Where two warpgroups' tiles load the SMs unevenly (the dispatch makes them stream-K) and one
#   warpgroup's tight blocks, unsplit, fill a single wave of two CTAs per SM to ONE_WAVE_MIN_FILL:
#   11008x4096 M = 272 and 304 (258 tiles of 96 and 112 rows for 264 slots) lost 20-25 % on two
#   warpgroups (172 tiles over 132 SMs). Where two warpgroups' tiles spread evenly they keep them
#   (16384x5120 M = 144-256: 128 tiles, 5-10 % faster than one warpgroup's 256).
# Past 256 rows, one warpgroup keeps 128-row blocks only where they fit ONE_WARPGROUP_MAX_WAVES wave of
# two CTAs per SM; past it two warpgroups' tight blocks take the shape even where their tiles load the
# SMs unevenly (the dispatch makes them stream-K): a partial second wave of 128-row blocks costs more
# than stream-K's fix-ups. H200, 2026-12-02n (results/h200_ab_2026-12-02n_large_m.json, 3 rounds, every
# config checked against the FP32 reference): against 50f8361's dispatch, where one warpgroup's blocks
# ran one to two waves, 0.75-0.98x the time in 15 of 16 cells on nine shapes of 48-148 weight tiles
# at M = 369-1024 (12288x8192 M = 449 124.47 us against 165.52; 6144x8192 M = 897 125.84 against
# 163.24), 1.013x on 10240x4096 M = 481 (stream-K over 256-row blocks against 128-row ones); then
# past two waves ('past_two_waves'), 0.75-0.92x in 10 of 11 cells on seven shapes of 80-272 tiles
# at M = 384-1024 (10240x4096 M = 832 95.35 against 126.66; 34816x4096 M = 480 185.17 against
# 232.02), 1.002x on 13824x4096 M = 640. Held out ('held_out', K = 2048-14336): 0.80-0.89x in all
# five cells (10240x5120 M = 929 132.68 against 165.79).
TWO_WARPGROUP_MIN_K_TILES_PER_SM = 20
ONE_WAVE_MIN_FILL = 0.95
ONE_WARPGROUP_MAX_WAVES = 1


def two_warpgroup_tiles_load_sms_unevenly(m: int, n: int, k: int, sm_count: int) -> bool:
    """Whether two warpgroups' tiles, one CTA per SM, leave the busiest SM WGMMA_STREAMK_MIN_IMBALANCE
    times the mean (the dispatch then runs them as stream-K)."""
    two_tiles = _tiles(m, n, _two_warpgroup_config(m, n, k, sm_count).block_x)
    return example.sm_imbalance(two_tiles, sm_count) >= WGMMA_STREAMK_MIN_IMBALANCE


def takes_two_warpgroups(m: int, n: int, k: int, sm_count: int) -> bool:
    """Whether the heuristic gives this M two warpgroups (see above)."""
    if m <= ONE_WARPGROUP_MAX_BLOCK_X:
        return False
    one = tight_wgmma_config(m, n, k, sm_count=sm_count)
    two_tiles = _tiles(m, n, _two_warpgroup_config(m, n, k, sm_count).block_x)
    if two_tiles * (k // SWIZZLE_K) < TWO_WARPGROUP_MIN_K_TILES_PER_SM * sm_count:
        return False
    slots = SMALL_M_CTAS_PER_SM * sm_count
    uneven = two_warpgroup_tiles_load_sms_unevenly(m, n, k, sm_count)
    one_tiles = _tiles(m, n, one.block_x)
    if uneven and ONE_WAVE_MIN_FILL * slots <= one_tiles <= slots:
        return False
    past_one_wave = one_tiles > ONE_WARPGROUP_MAX_WAVES * slots
    return m <= HEURISTIC_MAX_BLOCK_X or one.block_x < TMA_BLOCK_X or not uneven or past_one_wave


# Two consumer warpgroups take a producer warpgroup: on the H200 (2026-11-30i, the tuner's --twins on
# the table's configs at M = 144-832, five shapes, results/h200_timings_2026-11-30i_producer_twins.json)
# it was faster in all 43 two-warpgroup cells, split-K and stream-K alike: 0.90x the time on geometric
# mean, 0.81x at best (34816x5120 M = 272, stream-K), 0.99x at worst. With one consumer warpgroup (two
# CTAs per SM) it lost both cells timed (14336x5120 M = 832: 234.6 us against 184.7), so only the
# tuner's table can give it to those. Past the twins' M it can lose: the tuner found 34816x5120 M =
# 1024 as two-warpgroup stream-K with a producer at 616.8 us, where the 2026-11-30h benchmark ran the
# same config without one at 515; the heuristic gives that M one warpgroup (TMA_BLOCK_X rows).
TWO_WARPGROUP_PRODUCER = True


def _two_warpgroup_config(m: int, n: int, k: int, sm_count: int) -> WgmmaConfig:
    block_x = tight_wgmma_config(m, n, k, sm_count=sm_count, max_block_x=HEURISTIC_MAX_BLOCK_X).block_x
    stages = min(deepest_stages(block_x, ctas_per_sm=1), k // SWIZZLE_K)
    return WgmmaConfig(block_x, SWIZZLE_K, stages, 1, True, 2, TWO_WARPGROUP_PRODUCER)


# One wave of whole tiles. The covers above cut M into as few x blocks as they can; where the weight
# tiles are few (N = 3072-8192: 24-64 tiles for 132 SMs) that leaves fewer tiles than SMs, or a few
# over, and so stream-K and its fix-ups. Cutting M into as many x blocks as one wave holds
# (``whole_waves_block_x``) gives each SM at most one whole tile, for one more dequant of the weights
# per block: two consumer warpgroups and a producer, 128-deep k tiles, the deepest pipeline.
# H200, 2026-11-30w, raced and each verified, against the dispatch's config without this rule
# (results/h200_timings_2026-11-30w_one_wave_probe.json and _one_wave_rule_probe.json; 40 cells on
# eleven shapes at M = 72-608; the limits were read off all of them, so all are in-sample): in the 21
# cells the limits keep, 0.70-0.99x the time (4096x4096 M = 256 18.7 us against 26.7; 4096x14336
# M = 512 75.2 against 98.8; 5120x6144 M = 512 44.0 against the table's stream-K 49.4; the closest,
# 6144x6144 M = 192 and 256, 0.98-0.99x). The limits leave out every cell that lost:
# - x blocks under ONE_WAVE_MIN_BLOCK_X rows, where a tile's dequant outweighs its MMA: 6144x6144
#   M = 96 (48 rows) 24.0 against 20.0, 2560x8192 M = 96 (16) 25.1 against 18.2, 3072x4096 M = 96
#   and 192 (32, 48) 3 % slower. (Against one warpgroup's split-K some of them won: see below.)
# - past ONE_WAVE_MAX_K, blocks under TMA_BLOCK_X rows, where stream-K over wider blocks wins: its
#   fix-up costs the same per tile at any K while the extra dequant grows with K. 2560x8192 M = 320
#   (64 rows) 33.2 against 28.0, 4096x11008 M = 256 (64) 44.2 against 39.1, 5120x17408 M = 256 (96)
#   74.7 against 68.5. (Two such cells won: 4096x11008 M = 384 and 8192x8192 M = 192, 96 rows.)
# - fewer than ONE_WAVE_MIN_STAGES stages (blocks over 176 rows): 6144x4096 M = 384, 192 rows, 3
#   stages, 34.7 against 32.6.
# Where the dispatch would run one warpgroup (split-K) above SMALL_M, blocks from
# ONE_WAVE_OVER_ONE_WARPGROUP_MIN_BLOCK_X rows: every such cell of the probes won, 4096x4096 M = 72
# and 128 (32 rows) 0.87x and 0.80x the time (15.0-15.2 us against 17.2-19.0), and 2560x8192 M = 192
# (32) 0.88x and 8192x8192 M = 96 (48) 0.95x, which ONE_WAVE_MAX_K still leaves out; the small blocks
# that lost did so against two warpgroups' stream-K. In
# the untuned benchmark (results/h200_untuned_2026-11-30x.json, then _y) it took 4096x4096 M = 72-144
# from 17.7-19.9 us to 15.0-17.0.
# The blocks come in 8-row steps (WHOLE_WAVES_ROW_STEP) since 2026-12-02k; the limits above were read
# off 16-row steps. Each limit is now the 8-row block that the same M and tiles give where the
# 16-row block met the old one (64 -> 56, 32 -> 24, TMA_BLOCK_X -> ONE_WAVE_DEEP_K_MIN_BLOCK_X, and
# TWO_WAVES_MIN_BLOCK_X 112 -> 104), so the rules take the same cells with up to 8 fewer padding
# rows per block; 184-row blocks, which hold four stages where 192-row ones held three, are new. In
# the race of the split-wave rule below (2026-12-02k), where only that changed: 0.95-0.99x the time
# in most cells (6144x4096 M = 272 23.93 us against 25.12; 8192x28672 M = 608 341.35 against
# 355.69); with 184-row blocks 0.78-0.79x (8192x28672 M = 720 402.53 against 514.71, 3072x4096 M =
# 904) and 1.006x (6144x6144 M = 360, the one cell slower).
ONE_WAVE_MIN_BLOCK_X = 56
ONE_WAVE_FIRST_MIN_BLOCK_X = 64  # past 144 rows the split-wave rule comes first below this (see there)
ONE_WAVE_OVER_ONE_WARPGROUP_MIN_BLOCK_X = 24
ONE_WAVE_MAX_K = 6144
ONE_WAVE_DEEP_K_MIN_BLOCK_X = 120
ONE_WAVE_MIN_STAGES = 4
# Over 176 rows 128-deep tiles hold fewer than ONE_WAVE_MIN_STAGES stages; there the one wave takes
# 64-deep tiles (up to MAX_BLOCK_X rows) where its tiles fill at least WIDE_ONE_WAVE_MIN_FILL of the
# SMs. H200, 2026-12-02n (results/h200_ab_2026-12-02n_large_m.json, as above): 0.83-0.98x the time of
# 50f8361's dispatch in all 19 cells it decides on eleven shapes of 24-64 weight tiles at M = 449-1024
# (7168x4096 M = 577 48.71 us against 58.45 for stream-K; 3072x4096 M = 929 32.99 against 39.54;
# 5120x4096 M = 833 47.16 against 55.42). Below the fill it lost or tied: 4608x4096 (36 tiles in three
# blocks, 0.82) M = 897 1.05x and M = 705 0.97x; 6144x4096 and 6144x6144 (0.73) M = 608 1.01-1.02x.
# Held out ('held_out', K = 2048-14336): 0.86-0.98x in all seven cells (5120x14336 M = 1017 191.00
# against 221.39).
WIDE_ONE_WAVE_MIN_FILL = 0.84


# Two whole waves. Where one x block's tiles spread unevenly (the dispatch makes them stream-K) or
# the heuristic keeps one warpgroup, M cut into as many x blocks as two waves hold, where those tiles
# fill at least TWO_WAVES_MIN_FILL of the two waves with blocks of TWO_WAVES_MIN_BLOCK_X to 176 rows:
# the one-wave config twice over. H200, 2026-11-30w, raced and each verified (results/h200_timings_
# 2026-11-30w_whole_waves_probe.json; 18 cells on ten shapes at M = 256-1024; in-sample), in all six
# cells it takes: 11008x4096 (86 tiles, three blocks) M = 304 / 384 / 416 / 512 46.2 / 47.2 / 51.2 /
# 62.5 us against 50.6 / 49.1 / 56.0 / 81.3 (one warpgroup or stream-K), 8192x8192 M = 608 106.0
# against 121.9, 8192x4096 M = 640 55.9 against 63.1 (stream-K); in the untuned benchmark (results/
# h200_untuned_2026-11-30w.json, then _x) 11008x4096 M = 304-512 0.76-0.92x the time (M = 512: 61.7
# against 81.5, cuBLAS 60.8). Left out, and lost: 96-row blocks
# (11008x4096 M = 256, 42.9 against 38.6), 91 % fill (6144x4096 M = 512, five blocks: 42.5 against
# 41.4), and wherever the dispatch already runs one even wave of up to 256 rows (8192x8192 M = 448,
# 82.2 against 72.9; 8192x4096 M = 512, 4096x11008 and 4096x4096 M = 1024, 5-8 % slower).
TWO_WAVES_MIN_FILL = 0.95
TWO_WAVES_MIN_BLOCK_X = 104
WHOLE_WAVES_ROW_STEP = X_BLOCK_STEP


def whole_waves_block_x(m: int, n: int, sm_count: int, waves: int = 1) -> Optional[int]:
    """The x block (a multiple of WHOLE_WAVES_ROW_STEP) that cuts M into as many blocks as the weight
    tiles leave room for in ``waves`` waves; None where that is one block or wider than two
    warpgroups take."""
    x_blocks = min(waves * sm_count // (n // CTA_ROWS), -(-m // 16))
    if x_blocks < 2:
        return None
    block_x = x_block_rows(m, x_blocks, WHOLE_WAVES_ROW_STEP)
    return block_x if block_x <= MAX_BLOCK_X else None


def whole_tiles_config(block_x: int, k: int, block_k: int = DEEP_K, min_stages: int = ONE_WAVE_MIN_STAGES, split: int = 1) -> Optional[WgmmaConfig]:
    """Tiles of ``block_x`` rows split ``split`` ways along K (whole by default), two consumer
    warpgroups and a producer, ``block_k`` deep, the deepest pipeline that fits (at most a split's k
    tiles); None under ``min_stages`` stages. The heuristic's one- and two-wave configs and its
    split-wave one (``split_wave_config``), and the tuner's whole-wave candidates."""
    stages = min(deepest_stages(block_x, ctas_per_sm=1, block_k=block_k), k // block_k // split)
    return WgmmaConfig(block_x, block_k, stages, split, True, 2, True) if stages >= min_stages else None


def one_wave_config(m: int, n: int, k: int, *, sm_count: int = 132, over_one_warpgroup: bool = False) -> Optional[WgmmaConfig]:
    """The heuristic's one-wave config within the limits above (``ONE_WAVE_MIN_BLOCK_X``; with
    ``over_one_warpgroup``, the dispatch's alternative being one warpgroup above SMALL_M rows,
    ``ONE_WAVE_OVER_ONE_WARPGROUP_MIN_BLOCK_X``), 128 deep, or 64 deep where 128-deep tiles hold too
    few stages and the tiles fill ``WIDE_ONE_WAVE_MIN_FILL`` of the SMs; else None."""
    block_x = whole_waves_block_x(m, n, sm_count) if k % DEEP_K == 0 else None
    min_block_x = ONE_WAVE_OVER_ONE_WARPGROUP_MIN_BLOCK_X if over_one_warpgroup and m > SMALL_M else ONE_WAVE_MIN_BLOCK_X
    if block_x is None or block_x < min_block_x or (k > ONE_WAVE_MAX_K and block_x < ONE_WAVE_DEEP_K_MIN_BLOCK_X):
        return None
    config = whole_tiles_config(block_x, k)
    if config is None and _tiles(m, n, block_x) >= WIDE_ONE_WAVE_MIN_FILL * sm_count:
        config = whole_tiles_config(block_x, k, block_k=SWIZZLE_K)
    return config


def two_waves_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The two-wave config within the limits above (``TWO_WAVES_MIN_FILL``), else None. The dispatch
    asks only where it would otherwise run stream-K or one warpgroup."""
    block_x = whole_waves_block_x(m, n, sm_count, waves=2) if k % DEEP_K == 0 else None
    if block_x is None or block_x < TWO_WAVES_MIN_BLOCK_X or _tiles(m, n, block_x) < TWO_WAVES_MIN_FILL * 2 * sm_count:
        return None
    return whole_tiles_config(block_x, k)


# Up to SPLIT_WAVE_MAX_M rows, one wave of split tiles (the split-wave rule). Where the weight tiles number no more
# than the SMs, the tuned table's winners (H200, 2026-12-02) at M = 17-64 on 16384x5120, 14336x5120
# and 5120x6144 and at M = 17-32 on 5120x17408 are one shape of config: two consumer warpgroups and
# a producer, 128-deep k tiles by TMA, the deepest pipeline, the x block in 8-row steps, split along
# K as far as the CTAs still find an SM each (16384x5120 and 14336x5120 unsplit, 128 and 112 tiles;
# 5120x6144 and 5120x17408 split 3, 120 CTAs). At M = 33-64 5120x17408 took the same tiles as
# two-warpgroup stream-K. The rule under it (``_small_m_config``: one warpgroup, cp.async, 16-row
# steps, a split towards two CTAs per SM) was fitted to timings of 2026-11-30, which predate 8-row x
# blocks and those winners. Raced on the four untuned shapes at M = 17, 24, 32, 40, 48 and 56 (H200,
# 2026-12-02h, 3 rounds each, every config checked against the reference;
# results/h200_ab_2026-12-02h_small_m_one_wave.json), this rule's config took 0.72-0.94x the old
# rule's time in all 24 cells (4096x11008 M = 17 13.97 us against 18.06; 4096x4096 M = 56 10.53
# against 13.40; 6144x4096 M = 48 10.61 against 13.89). The next lower split lost in all 14 cells
# that had one (1.09-1.48x); the same tiles as two-warpgroup stream-K took 0.96-1.01x on 11008x4096
# (86 tiles) and 0.99-1.22x elsewhere, one-warpgroup stream-K 1.01x and more everywhere. A split
# keeps at least SPLIT_WAVE_MIN_SPLIT_K of K (as many k as the old rule's
# MIN_K_TILES_PER_SPLIT 64-deep tiles).
# From SMALL_M to 128 rows the table holds the same shape of config (16384x5120 and
# 14336x5120 unsplit at M = 65-128, 5120x6144 split 3 at 73-128), where the heuristic gave one
# warpgroup by cp.async (N >= 14336), four 32-row blocks (4096x4096) or 64-row blocks split 4
# (4096x11008). Raced (H200, 2026-12-02i, results/h200_ab_2026-12-02i_one_wave_m64-128.json, 3
# rounds, all verified) on the four untuned shapes at M = 64, 72, 96 and 128, then checked on nine
# shapes not used to set it at M = 64, 80, 96 and 128. Of the 41 cells where that changed the
# dispatch's config, 38 ran 0.58-0.99x the time of the rule before (4096x11008 M = 72 18.28 us
# against 31.27; 14336x4096 M = 96 20.99 against 31.76; 8192x28672 M = 128 83.54 against 105.45),
# 5120x17408 M = 80 and 96 1.01-1.02x (its table takes stream-K there), and 3072x4096 M = 128 (96
# CTAs of 8 k tiles) 1.09x: 14.43 against 13.20 for stream-K over two 64-row blocks. Where its CTAs
# leave more than a sixth of the SMs idle the dispatch runs the same tiles as stream-K from SMALL_M
# (``WGMMA_STREAMK_MIN_IMBALANCE``: 6144x4096's 96 CTAs, 11008x4096's 86), which took 0.73-1.00x the
# time before. It comes before the one-wave rule of whole 64-row x blocks (``one_wave_config``,
# which M = 97-128 reaches on 45-66 weight tiles): raced after it at M = 104-128 on 6144x4096,
# 7168x4096, 7680x4096, 8192x4096 and 8192x5120
# (results/h200_ab_2026-12-02i_split_wave_before_whole_64_row_blocks.json), this rule's config as
# the dispatch runs it took 0.86-1.00x the time of the whole 64-row blocks in all 12 cells
# (6144x4096 M = 104 15.72 us against 18.28, as stream-K; 8192x5120 M = 104 19.33 against 22.18;
# 8192x4096 M = 128 18.65 against 18.58, the one tie). Over the three races, with the dispatch as it
# now is: within 4 % of the fastest config raced in 60 of the 61 cells that timed its config; of the
# 53 cells whose config it changed, 49 faster, that tie, and the three losses above.
# Past 128 rows it comes before two warpgroups' tight blocks, up to 176 rows, the last M raced (its
# 128-deep tiles hold five stages up to 144 rows and four from 152; 184-row blocks would still hold
# four, which no race timed, and 192-row ones three). Raced (H200, 2026-12-02j,
# results/h200_ab_2026-12-02j_one_wave_m129-256.json, 3 rounds, all verified) on the four untuned
# shapes at M = 144, 192 and 256: at 144 it took 0.91-0.93x the dispatch's time before (4096x11008
# 25.43 us against 27.99; 11008x4096 and 6144x4096 as stream-K), at 192 and 256 (64-deep tiles) one
# x block lost every cell. Then on eleven shapes at M = 136-176:
# 0.66-1.00x in 42 of the 48 cells where the dispatch now runs it (2560x8192 M = 152 19.53 against
# 29.77; 8192x28672 M = 168 103.28 against 111.19), 3072x4096 1.04-1.13x in five of its six cells
# (96 CTAs of 8 k tiles, as at M = 128) and 8192x4096 M = 144 1.02x. Past SPLIT_WAVE_FIRST_MAX_M
# rows it comes after the one-wave rule of whole x blocks of ONE_WAVE_FIRST_MIN_BLOCK_X rows or more
# (``one_wave_config``; the stream-K module's ``heuristic_config`` decides the order): at M = 152 and
# 160, four stages deep, it lost 3-9 % on 7168x4096 and 8192x4096 to their whole 80-row blocks (and
# won 1-9 % on 6144x4096). Ahead of whole blocks of 56 rows it won 5120x5120 and 4608x4096 at M =
# 152-168 (5120x5120 M = 152 20.01 us against 21.88 for 64-row blocks; the race below).
# From 177 to SPLIT_WAVE_MAX_M rows: two x blocks of at most SPLIT_WAVE_MAX_BLOCK_X rows (its 128-deep
# tiles hold four stages; five up to 144 rows), split to fill one wave as above. Raced (H200,
# 2026-12-02k, results/h200_ab_2026-12-02k_split_wave_two_blocks.json, 3 rounds, every config checked
# against the reference; the dispatch as committed before against this one) on the four untuned
# shapes and eight others at M = 152-1024 (with the whole-wave rules' 8-row steps, above), then held
# out on twelve more: in the 76 cells of the first set where the dispatch changed, all faster,
# 0.57-1.00x (2560x8192 M = 352 27.66 us against 48.74; 4096x11008 M = 272 36.84 against 41.75;
# 4096x4096 M = 192 15.79 against 18.63); in the 51 held-out ones, 50 faster (0.58-0.99x: 2048x8192
# M = 208 17.42 against 29.85) and 6144x6144 M = 360 1.006x. The limits leave out every cell where
# two blocks lost:
# - a split's K over SPLIT_WAVE_TWO_BLOCKS_MAX_SPLIT_K, where stream-K over one x block of all M
#   rows dequantizes the weights once and spreads its fix-up over many k tiles: 8192x28672 M = 192
#   and 208 (28672 k per CTA) 126.40 and 132.07 us against 117.53 and 125.64, 5120x13824 (13824)
#   1.04-1.06x, 3584x18944 (9472) 1.02-1.04x; 4096x14336 (7168) and 8192x8192 (8192) won 0.92-0.96x;
# - a split's K under SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K, where the split-K exchange of two blocks
#   outweighs a few k tiles per CTA (results/h200_ab_2026-12-02k_two_blocks_small_n_and_many_tiles.json,
#   against stream-K over 64-row blocks, which the dispatch gives those cells): 1024 k per split on
#   1536x4096 (split 4) 1.03-1.17x, 1024x4096 (split 4) at M = 192-352 1.00-1.24x, 1024x8192 (split 8)
#   0.97-1.09x; 1536x8960 (1792) won 0.89-0.98x, 4096x4096 and 2048x8192 (2048) 0.58-0.99x. (1024x4096
#   at M = 192-256 ran one warpgroup's 24-32 CTAs, 26.4 us, where stream-K over 64-row blocks took
#   11.3-11.7; the narrow split wave below now takes those cells, at 9.8-10.3.)
SPLIT_WAVE_MIN_SPLIT_K = MIN_K_TILES_PER_SPLIT * SWIZZLE_K
SPLIT_WAVE_MAX_M = 352
SPLIT_WAVE_FIRST_MAX_M = 144
SPLIT_WAVE_MAX_BLOCK_X = 176
SPLIT_WAVE_TWO_BLOCKS_MAX_SPLIT_K = 8192
SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K = 12 * DEEP_K


def split_wave_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The split-wave config above for ``HEURISTIC_MIN_M <= m <= SPLIT_WAVE_MAX_M``, else None (more
    weight tiles than SMs, K not in whole 128-deep tiles, too few stages, or two x blocks outside
    their limits)."""
    if not HEURISTIC_MIN_M <= m <= SPLIT_WAVE_MAX_M:
        return None
    x_blocks = -(-m // SPLIT_WAVE_MAX_BLOCK_X)
    config = one_wave_split_config(m, n, k, x_blocks, SPLIT_WAVE_MIN_SPLIT_K, sm_count)
    if config is None or (x_blocks > 1 and not SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K <= k // config.split_k <= SPLIT_WAVE_TWO_BLOCKS_MAX_SPLIT_K):
        return None
    return config


def one_wave_split(tiles: int, k: int, min_split_k: int, sm_count: int) -> int:
    """The largest split (up to the example's MAX_SPLIT_K) whose CTAs still find an SM each and keep
    ``min_split_k`` of K per split; 1 where none does."""
    return max(s for s in range(1, example.MAX_SPLIT_K + 1) if s == 1 or (tiles * s <= sm_count and k // s >= min_split_k))


def one_wave_split_config(m: int, n: int, k: int, x_blocks: int, min_split_k: int, sm_count: int) -> Optional[WgmmaConfig]:
    """M cut into ``x_blocks`` x blocks (``x_block_rows``), each weight tile split by ``one_wave_split``:
    the config of the split-wave rules (``whole_tiles_config``); None where K is not whole 128-deep
    tiles, the tiles outnumber the SMs, or a split's k tiles hold too few stages."""
    tiles = n // CTA_ROWS * x_blocks
    if k % DEEP_K or tiles > sm_count:
        return None
    return whole_tiles_config(x_block_rows(m, x_blocks), k, split=one_wave_split(tiles, k, min_split_k, sm_count))


# The narrow split wave. Where the rules above leave most SMs idle (small N; the stream-K module's
# ``heuristic_config`` asks where what it would run is split-K whose CTAs fill at most
# FEW_CTAS_MAX_FILL of the SMs): x blocks of at most NARROW_BLOCK_X rows (8-row steps) and a split
# that fills one wave down to NARROW_SPLIT_MIN_K_TILES 128-deep k tiles per split, otherwise the
# split-wave rule's config (two consumer warpgroups, a producer, TMA, the deepest pipeline). Those
# cells came from the split wave, whose split keeps SPLIT_WAVE_MIN_SPLIT_K of K (1024x4096 M = 176:
# 8 tiles of 176 rows split 4, 32 CTAs, 16.2 us), and past 176 rows from one warpgroup's 64-row
# blocks unsplit, 64 deep (1024x4096 M = 192: 24 CTAs of 64 k tiles, 26.2 us, and as long at
# 256x4096 M = 1016), whose split stops at the partials' DRAM-traffic bound (``example._split_k``;
# the partials of so few tiles stay in L2) and whose iterations are too few for stream-K
# (MIN_STREAMK_ITERATIONS_PER_CTA). H200, 2026-12-02l (results/h200_ab_2026-12-02l_narrow_split_
# wave.json, 3 rounds, every config checked against the FP32 reference). First against one warpgroup
# split to fill a wave, the same at two CTAs per SM, stream-K over the same blocks and the old
# dispatch on 13 shapes of N = 128-2048 at M = 32-1016: this config was the fastest in all 17 cells
# where it ran (1024x4096 M = 192 9.78 us against 26.18, one warpgroup 10.78, stream-K 11.15;
# 128x8192 M = 400 11.60 against 48.84; 1024x4096 M = 176 10.29 against 16.18). Held out, 36 cells of
# other shapes and M (N = 128-3072, K = 512-14336, M = 25-689) the quarter fill changes: all faster,
# 0.30-0.91x (512x5120 M = 185 9.87 against 32.63). Then 37 cells whose split-K CTAs fill a quarter to
# half of the SMs: 33 faster, 0.47-0.93x (512x3072 M = 521 9.86 against 20.77; 2048x4096 M = 104
# 10.26 against 12.31); slower where the old config already took the same block with 1024 k per split
# in 64 CTAs and this halves that at M <= 64, 1.03-1.05x (1024x8192 M = 32 10.20 against 9.71,
# M = 64, 2048x4096 M = 17); stream-K, which fills the SMs, stays (768x4096 M = 321, where this
# config took 0.90x its time).
FEW_CTAS_MAX_FILL = 0.5
NARROW_SPLIT_MIN_K_TILES = ONE_WAVE_MIN_STAGES


def narrow_split_wave_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The narrow split wave above, or None (K not in whole 128-deep tiles or under four of them,
    more tiles than SMs)."""
    return one_wave_split_config(m, n, k, -(-m // NARROW_BLOCK_X), NARROW_SPLIT_MIN_K_TILES * DEEP_K, sm_count)


# The two-CTA split wave. At M = HEURISTIC_MIN_M-TWO_CTA_SPLIT_WAVE_MAX_M, where the weight tiles
# fill two CTAs per SM once split 2 or 3 ways (TWO_CTA_SPLIT_WAVE_MAX_SPLIT): one consumer
# warpgroup with a producer that makes the scale pairs, its A registers in two batches, 128-deep
# k tiles by TMA, TWO_CTA_SPLIT_WAVE_STAGES stages, the x block in 8-row steps, split to fill the
# 2 * SMs slots. That is the tuned table's form at M = 17-32 of 16384x5120 (128 tiles, split 2) and
# 14336x5120 (112 tiles, split 2). Raced on the four untuned shapes at M = 24 and 32 against the
# split-wave rule's two warpgroups (H200, 2026-12-03l, results/h200_ab_2026-12-03l_heuristic_one_
# warpgroup_split.json, 5 rounds, every config checked against the FP32 reference first): 11008x4096
# (86 tiles, split 3: 258 CTAs) 12.95 us against 15.01 at M = 24 and 13.70 against 15.36 at 32; the
# other splits there 0.98-1.23x. On fewer tiles every split lost: 6144x4096 (48 tiles, splits 2-4)
# 1.07-1.22x, 4096x4096 and 4096x11008 (32 tiles, splits 2-4) 1.09-1.65x, as 5120x17408 and
# 5120x6144 (40 tiles) in the tuner's twins at every split up to 6 (2026-12-03k). Splits of 4 and
# more were never won, so the rule stops at 3 (67 to 132 tiles on 132 SMs).
TWO_CTA_SPLIT_WAVE_MAX_M = 32
TWO_CTA_SPLIT_WAVE_MAX_SPLIT = 3
TWO_CTA_SPLIT_WAVE_STAGES = 5  # the deepest pipeline whose scale pairs fit two CTAs of 32 rows


def two_cta_split_wave_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The two-CTA split wave above, or None (M outside its rows, K not in whole 128-deep tiles, the
    tiles past two per SM or needing a split over its limit, or a split's k tiles under its stages)."""
    tiles = n // CTA_ROWS
    split = 2 * sm_count // tiles
    if not HEURISTIC_MIN_M <= m <= TWO_CTA_SPLIT_WAVE_MAX_M or k % DEEP_K or not 2 <= split <= TWO_CTA_SPLIT_WAVE_MAX_SPLIT:
        return None
    if k // DEEP_K // split < TWO_CTA_SPLIT_WAVE_STAGES:
        return None
    return WgmmaConfig(
        x_block_rows(m, 1), DEEP_K, TWO_CTA_SPLIT_WAVE_STAGES, split, True, 1, True, a_batches=2, scale_pairs=True
    )


# The two-block split wave. Where the split wave runs one x block (M <= SPLIT_WAVE_MAX_BLOCK_X) whose
# splits stop at SPLIT_WAVE_MIN_SPLIT_K of K (eight 128-deep k tiles a CTA: the pipeline's fill and
# the split-K exchange of all M rows weigh heavily against so short a k loop), the same
# rule over two x blocks of half the rows, split to fill one wave: at most half the split, twice the
# k tiles per CTA, each weight tile dequantized twice. Where the narrow split wave takes the cell
# (FEW_CTAS_MAX_FILL) it stays. H200, 2026-12-02m (results/h200_ab_2026-12-02m_two_block_split_wave.json,
# 3 rounds, every config checked against the FP32 reference), against 2975622's dispatch:
# - at half to 80 % fill, M = 80-176 (race mid_fill), the two blocks were the fastest of five
#   candidates in 15 of 17 cells (3072x4096 M = 144 13.52 us against 15.88; 2048x5120 M = 160 12.65
#   against 16.38); stream-K over the same two blocks won the other two by 2-4 % and lost the rest by
#   up to 27 %, so the rule's config is returned as it is (the dispatch's imbalance test would make
#   stream-K of 72-96 CTAs of unsplit tiles: 4608x2048 M = 128 13.61 against 10.71);
# - where one block's split is not at that floor, two blocks lost whatever the fill (5120x4096 M = 96
#   1.21x, split 3 of 1365 k; 3072x8192 M = 128 1.18x; 7168x4096, 4096x11008, 6144x4096 and 6144x6144
#   1.01-1.26x; 2560x8192 0.98-1.02x), and where it is they won at 97 % fill too (4096x4096 M = 144
#   13.82 against 15.46);
# - with as many CTAs as one block, still split (the split halves), from
#   TWO_BLOCK_SPLIT_WAVE_SAME_CTAS_MIN_M rows: 3072x4096 at M = 32-120 took 0.99-1.18x the time
#   (1.03x at 120), at 128 0.95x, at 144-176 0.83-0.85x; 4096x4096 M = 104-128 1.03x, 1.00x and
#   0.98x. With more CTAs, or as many unsplit (no exchange left), from TWO_BLOCK_SPLIT_WAVE_MIN_M:
#   more CTAs 0.86-0.92x at M = 48-96 (2560x4096 M = 48 8.66 against 9.66) and 0.88-1.05x at 24-40
#   rows (blocks of 16-24 rows; race check); unsplit at K = 2048 (race unsplit and the others)
#   0.95-0.97x at M = 48-56, 0.86-0.93x at 64-96 (6144x2048 M = 96 9.99 against 11.65), 1.01x at 40
#   and 1.11x at 32 (4608x2048);
# - fewer CTAs than one block (the one-wave split of twice the tiles is lower than half): 3072x5120
#   M = 96 1.09x (at 160 0.97x), 5120x3072 M = 128 1.04x; left out.
# As the dispatch runs it now, 52 cells of the four races change, all faster: 0.77-0.98x, geometric
# mean 0.88 (held out in race check: 2816x4096 M = 152 13.18 against 15.26, 1792x7168 M = 144 13.52
# against 16.97).
TWO_BLOCK_SPLIT_WAVE_MIN_M = 48
TWO_BLOCK_SPLIT_WAVE_SAME_CTAS_MIN_M = 128


def two_block_split_wave_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional[WgmmaConfig]:
    """The two-block split wave above, or None (no one-block split wave at its split floor, the
    narrow split wave's cell, two blocks' tiles past one wave, fewer CTAs, or fewer rows than their
    limits ask)."""
    one_block = split_wave_config(m, n, k, sm_count=sm_count)
    if one_block is None or m > SPLIT_WAVE_MAX_BLOCK_X or k // one_block.split_k > SPLIT_WAVE_MIN_SPLIT_K:
        return None
    one_block_ctas = wgmma_ctas(one_block, m, n)
    if one_block_ctas <= FEW_CTAS_MAX_FILL * sm_count:
        return None
    two_blocks = one_wave_split_config(m, n, k, 2, SPLIT_WAVE_MIN_SPLIT_K, sm_count)
    if two_blocks is None:
        return None
    ctas = wgmma_ctas(two_blocks, m, n)
    still_split = ctas == one_block_ctas and two_blocks.split_k > 1
    min_m = TWO_BLOCK_SPLIT_WAVE_SAME_CTAS_MIN_M if still_split else TWO_BLOCK_SPLIT_WAVE_MIN_M
    return two_blocks if ctas >= one_block_ctas and m >= min_m else None


def _x_blocks_for(m: int, n: int, k: int, sm_count: int) -> WgmmaConfig:
    """The x block and split of ``get_wgmma_config`` (see there)."""
    tight = tight_wgmma_config(m, n, k, sm_count=sm_count)
    if m < SMALL_M:
        return tight
    narrow = _x_blocked(m, n, k, NARROW_BLOCK_X, sm_count)
    if tight.split_k > 1 and wgmma_ctas(narrow, m, n) >= wgmma_ctas(tight, m, n):
        return narrow
    if 2 * wgmma_ctas(tight, m, n) >= sm_count:
        return tight
    return narrow if wgmma_ctas(narrow, m, n) > wgmma_ctas(tight, m, n) else tight


def check_wgmma_config(config: WgmmaConfig, n: int, k: int, config_types=(WgmmaConfig,), ctas_per_sm: int = 1) -> None:
    """The example's checks with this kernel's limits; ``ctas_per_sm``: those a stream-K config asks
    (with a producer they set the consumers' registers)."""
    example.check_config(config, n, k, config_types)
    if config.block_k not in (SWIZZLE_K, 2 * SWIZZLE_K):
        raise ValueError(f"config {config}: block_k must be {SWIZZLE_K} or {2 * SWIZZLE_K} (one or two 128-byte swizzled rows)")
    if config.block_x % X_BLOCK_STEP or config.block_x > MAX_BLOCK_X:
        raise ValueError(f"config {config}: block_x must be a multiple of {X_BLOCK_STEP} and at most {MAX_BLOCK_X}")
    if config.warpgroups not in (1, 2) or config.warpgroups < min_warpgroups(config.block_x):
        raise ValueError(f"config {config}: warpgroups must be 1 or 2, and 2 above {ONE_WARPGROUP_MAX_BLOCK_X} x rows")
    if config.stages < MIN_STAGES:
        raise ValueError(f"config {config}: stages must be at least {MIN_STAGES}")
    if config.producer and not config.tma_loads:
        raise ValueError(f"config {config}: a producer warpgroup needs tma_loads=True")
    if config.scale_pairs and not config.producer:
        raise ValueError(f"config {config}: the scale pairs are the producer warpgroup's to make (producer=True)")
    if config.scale_pairs and config.stages < SCALE_PAIR_MIN_STAGES:
        raise ValueError(f"config {config}: with scale pairs the producer needs at least {SCALE_PAIR_MIN_STAGES} stages (see SCALE_PAIR_MIN_STAGES)")
    smem = cta_smem(config) - CTA_RESERVED_SMEM
    if smem > SM90_SMEM_PER_CTA:
        raise ValueError(f"config {config}: {smem} bytes of shared memory, over {SM90_SMEM_PER_CTA} per CTA")
    if getattr(config, "tickets", False) and config.split_plan.split_k == 1:  # stream-K configs have no such field
        raise ValueError(f"config {config}: tickets chooses a split's exchange; it needs split_k > 1 or tail_k_tiles")
    tail, k_tiles = getattr(config, "tail_k_tiles", 0), k // config.block_k
    if tail and (tail >= k_tiles or (k_tiles - tail) // config.split_k < config.stages):
        raise ValueError(f"config {config}: the tails must leave each split at least `stages` of the {k_tiles} k tiles")
    if tail and config.tails_per_cta > n // CTA_ROWS:
        raise ValueError(f"config {config}: tails_per_cta must be at most the {n // CTA_ROWS} weight tiles")
    if tail and not config.split_plan.marked:
        raise ValueError(
            f"config {config}: tails need the marked exchange (no tickets; accumulators times pieces at most {example.EXCHANGE_BATCH_LOADS}), "
            "where a tail CTA posts its piece and runs on (see tail_ctas)"
        )
    if config.a_batches < 1 or config.block_k // example.FRAG_K % config.a_batches:
        raise ValueError(f"config {config}: a_batches must divide the {config.block_k // example.FRAG_K} k32 blocks of a k tile")
    a_size, acc_size = operand_sizes(config.block_x, config.block_k, config.warpgroups, config.a_batches)
    if acc_size + a_size > MAX_WGMMA_OPERAND_REGISTERS:  # two halves of a_size bf16 values: a_size registers
        raise ValueError(
            f"config {config}: {acc_size} accumulators and {a_size} A registers per thread exceed {MAX_WGMMA_OPERAND_REGISTERS}, "
            "where ptxas serializes the wgmmas (a smaller block_x or block_k, or two warpgroups)"
        )
    wgs = config.warpgroups
    bound = bounded_registers(wgs, ctas_per_sm)
    if not config.producer and bound and acc_size + a_size > bound - BOUNDED_NON_OPERAND_REGISTERS:
        raise ValueError(
            f"config {config}: {ctas_per_sm} CTAs per SM leave {bound - BOUNDED_NON_OPERAND_REGISTERS} registers per thread for "
            f"the wgmma operands, not {acc_size + a_size} (fewer CTAs, a smaller block_x or block_k)"
        )
    launched_for = producer_ctas_per_sm(wgs, ctas_per_sm) if config.producer else ctas_per_sm
    if launched_for * cta_smem(config) > SM90_SMEM_PER_SM:  # the registers are split for CTAs that would not fit
        raise ValueError(
            f"config {config}: launches for {launched_for} CTAs per SM (with a producer: {DEFAULT_PRODUCER_CTAS_PER_SM[wgs]} or stream-K's "
            f"ctas_per_sm), and {launched_for} CTAs of {cta_smem(config)} bytes of shared memory do not fit an SM's {SM90_SMEM_PER_SM}"
        )
    if config.producer and ctas_per_sm > DEFAULT_PRODUCER_CTAS_PER_SM[wgs]:
        limit = SHARED_SM_PRODUCER_MAX_OPERANDS.get((wgs, ctas_per_sm))
        batch_k32 = config.block_k // example.FRAG_K // config.a_batches
        if config.a_batches > 1 and batch_k32 > SHARED_SM_PRODUCER_BATCHED_K32.get((wgs, ctas_per_sm), batch_k32):
            raise ValueError(
                f"config {config}: with a producer, {ctas_per_sm} CTAs per SM of {wgs} consumer warpgroups take one k32 block per "
                "wgmma batch where a k tile has several (a_batches; see SHARED_SM_PRODUCER_BATCHED_K32)"
            )
        if limit is None or acc_size + a_size > limit:
            fits = "; ".join(f"{c} CTAs of {w} consumer warpgroup(s), up to {o}" for (w, c), o in SHARED_SM_PRODUCER_MAX_OPERANDS.items())
            raise ValueError(
                f"config {config}: with a producer warpgroup, {ctas_per_sm} CTAs per SM of {wgs} consumer warpgroup(s) and "
                f"{acc_size + a_size} wgmma operand registers do not fit; what fits: {fits}"
            )


CONSUMER_BARRIER = 1  # the named barrier of a CTA's consumer warpgroups (0 is __syncthreads)
PAIR_LAG = 2  # k tiles between the producer's load of a stage and its making of the stage's scale pairs
# The producer loads tile t once the consumers released tile t - stages, which they do while running
# tile t - stages + 1, which waits for that tile's pairs, made after the load of tile t - stages + 1
# + PAIR_LAG. That load must come before tile t's, or producer and consumers wait on each other: 3
# stages hung on the H200 (2026-12-03, sixtieth session).
SCALE_PAIR_MIN_STAGES = PAIR_LAG + 2


def consumer_sync(consumer_threads: int, threads: int):
    """A callable that emits the barrier of the threads holding accumulators, for the split-K and
    stream-K reductions: ``__syncthreads`` or, where the CTA has more threads (a producer warpgroup,
    which never reaches the reduction), the consumers' named barrier."""
    import tilelang.language as T

    if consumer_threads == threads:
        return T.sync_threads
    return lambda: T.sync_threads(CONSUMER_BARRIER, consumer_threads)


class WgmmaPipeline(NamedTuple):
    """The pieces of the wgmma kernel that do not depend on how a CTA's work is chosen, for one x
    block and stage count (see ``wgmma_pipeline``)."""

    acc_size: int
    threads: int
    consumer_threads: int
    producer_registers: int  # with a producer: what setmaxnreg leaves the producer's threads
    consumer_registers: int  # ... and gives each consumer thread
    sync_consumers: object  # the barrier of the split-K and stream-K reductions (``consumer_sync``)
    x_row: object
    w_row: object
    setup: object
    segment: object
    produce: object
    consume: object
    store: object


# The stage barriers' phase arithmetic, shared by the kernel and the CPU model of the producer
# protocol (test_producer_protocol_model): a CTA's k tiles are numbered i = 0, 1, ... over all its
# segments; tile i goes through stage i % stages as that stage's fill number i // stages.
def full_parity(i, stages: int):
    """The parity of the ``full`` phase that completes when k tile ``i`` has landed."""
    return i // stages % 2


def empty_parity(i, stages: int):
    """The parity a producer waits for on ``empty`` before loading k tile ``i``: the phase in which the
    consumers released the stage's previous fill. A fresh barrier counts its 'previous' phase (parity
    1) as complete, so the first fill of each stage does not wait."""
    return (i // stages + 1) % 2


def wgmma_pipeline(
    block_x: int,
    stages: int,
    tma_loads: bool,
    warpgroups: int,
    block_k: int = SWIZZLE_K,
    producer: bool = False,
    ctas_per_sm: int = 1,
    producer_registers: int = PRODUCER_REGISTERS,
    a_batches: int = 1,
    scale_pairs: bool = False,
) -> WgmmaPipeline:
    """The pipeline, as TileLang macros (with a ``producer``, for ``producer_ctas_per_sm(warpgroups,
    ctas_per_sm)`` CTAs per SM; ``a_batches`` wgmma batches per k tile).

    ``setup()`` allocates the shared stages (and, with TMA loads, their ``full`` barriers; with a
    producer, ``empty`` ones too; None otherwise) and the registers and points the wgmma descriptor at
    the x stages: ``x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc = setup()``.
    ``segment(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, a_regs, b_regs, acc, desc,
    count, kt0, base, bm, bn, m, tx)`` zeroes ``acc`` and accumulates k tiles ``kt0 .. kt0 + count``
    of weight tile ``bn`` against x block ``bm`` (rows at or past ``m`` read as zeros), leaving nothing
    in flight. ``count`` may be a Python int (the split-K kernel) or a run-time value; ``base`` counts
    the k tiles this CTA ran through the stages before (0 for the split-K kernel's one segment): the
    stages and their barrier phases continue from there.

    It keeps one batch of wgmmas in flight while the next is dequantized: k tile ``t`` waits for its
    stage, dequantizes into half ``t % 2`` of the A registers, issues its wgmmas and waits only for
    tile ``t - 1``'s. With ``a_batches`` > 1 a k tile's k32 blocks go in that many batches, each
    dequantized into the A half the batch before it does not hold and waited for by the next batch:
    the A registers hold two batches instead of two k tiles. The loads of tile ``t + stages - 2`` go
    into the stage of tile ``t - 2``, which like the A half a dequant overwrites was released by a
    wgmma wait of the previous k tile, which every warp passed before this k tile's barrier. The two
    loaders (``WgmmaConfig.tma_loads``):

    - cp.async from all threads, issued right after the barrier. cp.async writes are
      generic-proxy and wgmma reads async-proxy, so a ``fence.proxy.async`` follows each stage's wait.
    - TMA from one thread (x: a 2D box with the 128-byte swizzle the wgmma descriptor expects; codes
      and scales: 3D boxes of the CTA's fragment blocks), completing on the stage's ``full`` barrier
      and issued after the wgmma. TMA writes are async-proxy and the dequant only reads, so no fence.
      About 10 % fewer instructions per k tile; it wins with 128-row x blocks and loses with small
      ones (see ``TMA_BLOCK_X``).

    With a ``producer`` warpgroup (threads ``consumer_threads`` and up; one or two consumer
    warpgroups) the CTA-wide barrier per k tile goes: ``produce(...)`` (the producer's part,
    ``segment``'s arguments less the registers, plus ``empty``) waits for a stage's ``empty``
    barrier and loads the next k tile into it by TMA; ``consume(...)`` (the consumers': ``segment``'s
    arguments plus ``empty``) runs the k tiles as above, and k tile ``t``, once its wait has retired
    tile ``t - 1``'s wgmma, releases that tile's stage to the producer. Two consumer warpgroups then
    meet only at the stages, so one's dequant can overlap the other's wgmma; the loads no longer wait
    for any consumer's barrier. The last k tile's stage is not released: the caller does that after
    the output tile has gone through it.

    The producer keeps ``producer_registers`` (setmaxnreg) and the consumers share the rest.

    ``store(acc, x_tiles, stage, bm, bn, y, alpha_x128, m, tx, refilled)`` (the consumers') writes the scaled
    output tile to ``y`` through the x tile of ``stage``, the segment's last (see ``copy_out``).
    """
    import tilelang.language as T
    from tilelang.layout import make_full_bank_swizzled_layout

    bx, bk = block_x, block_k
    panels = bk // SWIZZLE_K  # an x stage is this many (bx, 64) tiles, each of 128-byte rows
    rows, wgs = CTA_ROWS, warpgroups
    n_chunks = [(j, min(WGMMA_MAX_N, bx - j)) for j in range(0, bx, WGMMA_MAX_N)]  # (first x row, wgmma N)
    consumer_threads = WARPGROUP_THREADS * wgs
    threads = consumer_threads + WARPGROUP_THREADS * producer
    producer_ctas = producer_ctas_per_sm(wgs, ctas_per_sm)
    bounded = bounded_registers(wgs, ctas_per_sm) is not None
    atoms = ATOMS // wgs  # m64 atoms per warpgroup
    blocks, kbs = rows // example.FRAG_N, bk // example.FRAG_K
    batch_a, acc_size = operand_sizes(bx, bk, wgs, a_batches)  # A values of one wgmma batch
    kbs_per_batch = kbs // a_batches
    x_stage_bytes = bx * bk * 2

    # Accumulator q = (p * bx / 8 + i) * 4 + c of warp w (counted over the CTA) holds x row
    # 8i + 2t + c % 2 (the wgmma D-fragment layout) and weight row 16 * atoms * w + 16p + 8(c // 2) + g:
    # 32w + 16p + ... with one warpgroup, 16w + ... (p = 0) with two (see the module docstring).
    def x_row(q, bm, lane):
        return bm * bx + q % (bx // 2) // 4 * 8 + lane % 4 * 2 + q % 2

    def w_row(q, bn, lane, warp):
        return bn * rows + warp * 16 * atoms + q // (bx // 2) * 16 + q % 4 // 2 * 8 + lane // 4

    load_x = x_tile_loader(bx, SWIZZLE_K, consumer_threads)  # cp.async: no producer (TMA only)
    device_source = example.DEVICE_SOURCE
    if wgs == 2:
        device_source += example.dequant_function("nvfp4_dequant_half_block", 2)
    dequant = "nvfp4_dequant_block" if wgs == 1 else "nvfp4_dequant_half_block"
    if scale_pairs:  # the producer makes each stage's scale pairs; the consumers read them
        dequant += "_pairs"
        device_source += example.dequant_function(dequant, 4 // wgs, pairs=True) + example.SCALE_PAIRS_SOURCE
    scale_words = example.SCALE_WORDS_PER_BLOCK
    pair_planes = 2  # a (block, k32) row's 2 * scale_words pairs, as two rows of scale_words words

    def pair_slot(scale_tiles, stage, block, kb, pair):
        """Where the producer writes, and the consumers read, pair ``pair`` of a (block, k32) row of
        ``stage``: the pair rows follow the ``stages`` rows of loaded scale words."""
        return scale_tiles[stages + pair_planes * stage + pair // scale_words, block, kb, pair % scale_words]

    def block_copier(words_per_block: int):
        """A macro copying the ``words_per_block`` words of this CTA's fragment blocks (codes or
        scales) of one k tile into a stage, 16 bytes per cp.async."""
        per_block = words_per_block // WORDS_PER_CHUNK
        chunks = blocks * kbs * per_block
        loaders = consumer_threads  # cp.async runs without a producer: every thread loads

        @T.macro
        def copy(src, dst, stage, nb, kt, tx):
            for c in T.unroll(T.ceildiv(chunks, loaders)):
                if c * loaders + tx < chunks:
                    b, kb, w = (c * loaders + tx) // (kbs * per_block), (c * loaders + tx) // per_block % kbs, (c * loaders + tx) % per_block
                    T.ptx_cp_async(
                        T.access_ptr(dst[stage, b, kb, w * WORDS_PER_CHUNK], "w", extent=WORDS_PER_CHUNK),
                        T.access_ptr(src[nb + b, kt * kbs + kb, w * WORDS_PER_CHUNK], "r", extent=WORDS_PER_CHUNK),
                        WORDS_PER_CHUNK,
                    )

        return copy

    copy_codes, copy_scales = block_copier(example.WORDS_PER_BLOCK), block_copier(example.SCALE_WORDS_PER_BLOCK)
    # TileLang elects the thread that issues a TMA copy from the whole CTA by default (warp 0): with a
    # producer it must be one of the producer warpgroup's (warp 8, the first of its 128-thread scope).
    tma_leader = {"leader_scope_threads": WARPGROUP_THREADS} if producer else {}

    @T.macro
    def load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, kt, stage, bm, bn, m, tx):
        """k tile ``kt``'s x, code and scale tiles into ``stage``; x rows at or past ``m`` are
        zero-filled (by TMA, or by a predicated cp.async that reads nothing)."""
        nb = bn * blocks
        if tma_loads:
            for p in T.unroll(panels):
                kp = (kt * panels + p) * SWIZZLE_K
                for j, cols in n_chunks:  # a TMA box holds at most 256 rows
                    T.tma_copy(x[bm * bx + j : bm * bx + j + cols, kp : kp + SWIZZLE_K], x_tiles[stage * panels + p, j : j + cols, :], barrier=full[stage], **tma_leader)
            T.tma_copy(codes[nb : nb + blocks, kt * kbs : kt * kbs + kbs, :], code_tiles[stage, :, :, :], barrier=full[stage], **tma_leader)
            T.tma_copy(scales[nb : nb + blocks, kt * kbs : kt * kbs + kbs, :], scale_tiles[stage, :, :, :], barrier=full[stage], **tma_leader)
            if producer:
                # Every producer thread arrives (``full`` counts WARPGROUP_THREADS): the elected one's
                # expect_tx precedes its own arrival, so the phase cannot complete before it.
                T.mbarrier_arrive(full[stage])
            elif tx == 0:
                T.mbarrier_arrive(full[stage])
        else:
            for p in T.unroll(panels):
                load_x(x, x_tiles, stage * panels + p, bm * bx, kt * panels + p, m, tx)
            copy_codes(codes, code_tiles, stage, nb, kt, tx)
            copy_scales(scales, scale_tiles, stage, nb, kt, tx)
            T.ptx_commit_group()

    @T.macro
    def load_ahead(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, t, count, kt0, base, bm, bn, m, tx):
        """The loads of k tile ``t + stages - 2``, if there is one."""
        if t + stages - 2 < count:
            load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, kt0 + t + stages - 2, (base + t + stages - 2) % stages, bm, bn, m, tx)
        elif not tma_loads:
            T.ptx_commit_group()  # an empty group keeps the wait counts uniform

    @T.macro
    def k_tile(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, t, half, count, kt0, base, bm, bn, m, tx):
        """k tile ``t`` of ``count`` (see above), its A registers in ``half``."""
        lane = tx % 32
        warp = tx // 32
        stage = (base + t) % stages
        if tma_loads:
            T.mbarrier_wait_parity(full[stage], full_parity(base + t, stages))  # tile t has landed
        else:
            T.ptx_wait_group(stages - 3)  # this thread's copies of tile t have landed
            T.fence_proxy_async()  # ... and are visible to the wgmma (async proxy) reads
        if scale_pairs:
            T.mbarrier_wait_parity(full[stages + stage], full_parity(base + t, stages))  # ... and its scale pairs are made
        if not producer:
            T.sync_threads()  # everyone's loads landed; everyone finished tile t - 2's dequant and wgmma
        if not tma_loads:
            load_ahead(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, t, count, kt0, base, bm, bn, m, tx)
        block, part = warp_words(warp, wgs)
        # The stage's descriptor once, as a 64-bit value: each wgmma then adds its constant offset in
        # one UIADD3.64, where ``desc + offset`` (a 32-bit add into the descriptor) cost ptxas three
        # uniform instructions per wgmma (W13's consumer loop: 361 SASS instructions against 387).
        stage_desc = T.alloc_var(T.uint64)
        stage_desc = desc[0] + stage * x_stage_bytes // 16
        steps = bk // 16 // a_batches  # k16 steps per batch
        for b in T.unroll(a_batches):
            buf = (half * a_batches + b) % 2  # the A half this batch fills; the other is in flight
            for kb in T.unroll(b * kbs_per_batch, (b + 1) * kbs_per_batch):
                if scale_pairs:  # lane group g's pairs: words 4g + 2 part .. of the block row's pairs
                    scale_at = pair_slot(scale_tiles, stage, block, kb, lane // 4 * 4 + part * 2)
                else:
                    scale_at = scale_tiles[stage, block, kb, lane // 4 * 2 + part]
                T.call_extern(
                    "handle",
                    dequant,
                    # Read-only pointers: an address_of here would count as a shared-memory write for
                    # TileLang's proxy analysis, which would then fence before the next TMA and wgmma.
                    T.access_ptr(code_tiles[stage, block, kb, lane * 4 + part * 2], "r", extent=4 // wgs),
                    T.access_ptr(scale_at, "r", extent=(4 if scale_pairs else 2) // wgs),
                    T.address_of(b_regs[0]),
                )
                # A register (h, rowhalf) of (k16 step s, m64 atom p) is B register 4(2p + rowhalf) + 2s + h
                # (word j = 2p + rowhalf of the words dequantized); q walks this k32 block's A values in
                # register order: q = ((s * atoms + p) * 4 + h * 2 + rh) * 2 + e.
                for q in T.unroll(2 * atoms * 8):
                    a_regs[buf * batch_a + (kb - b * kbs_per_batch) * 2 * atoms * 8 + q] = b_regs[
                        (4 * (2 * (q // 8 % atoms) + q // 2 % 2) + 2 * (q // (8 * atoms)) + q // 4 % 2) * 2 + q % 2
                    ]
            T.warpgroup_fence_operand(a_regs, buf * batch_a, num_regs=batch_a // 2)
            T.warpgroup_fence_operand(acc, num_regs=acc_size)
            T.warpgroup_arrive()
            for s, p in T.grid(steps, atoms):  # unrolled: nvcc unrolls the constant loops
                for j, cols in n_chunks:  # x rows j ..: 128 bytes each on, and their accumulators
                    ks = b * steps + s  # the k16 step of the tile
                    T.ptx_wgmma_rs(
                        T.float32, f"m{WGMMA_ATOM_M}n{cols}k16", True, "bf16", "bf16", "fp32",
                        a_regs.data, buf * batch_a + (s * atoms + p) * 8,
                        stage_desc, ((ks // 4 * bx + j) * X_ROW_BYTES + ks % 4 * 32) // 16,  # k16 step ks: its panel, 32 bytes on
                        acc.data, p * bx // 2 + j // 2,
                        1, 1, 1,
                    )  # fmt: skip
            T.warpgroup_commit_batch()
            if tma_loads and not producer and b == a_batches - 1:
                load_ahead(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, t, count, kt0, base, bm, bn, m, tx)
            T.warpgroup_wait(1)  # the previous batch's wgmma is done: its A half (and, at b = 0, tile t - 1's stage) are free
            T.warpgroup_fence_operand(acc, num_regs=acc_size)
            T.warpgroup_fence_operand(a_regs, (1 - buf) * batch_a, num_regs=batch_a // 2)
            if producer and b == 0:
                if t > 0:
                    T.mbarrier_arrive(empty[(base + t - 1) % stages])  # ... so the producer may refill it

    @T.macro
    def setup():
        if producer:  # launch with the registers these CTAs share; setmaxnreg re-divides them
            T.annotate_min_blocks_per_sm(producer_ctas)
        elif bounded:  # stream-K's CTAs per SM, where they leave under ptxas's 255 registers
            T.annotate_min_blocks_per_sm(ctas_per_sm)
        x_tiles = T.alloc_shared((stages * panels, bx, SWIZZLE_K), T.bfloat16)
        code_tiles = T.alloc_shared((stages, blocks, kbs, example.WORDS_PER_BLOCK), T.int32)
        # With scale pairs: the loaded scale words in stages 0 .., their pairs in pair_planes rows each after.
        scale_tiles = T.alloc_shared(((1 + pair_planes * scale_pairs) * stages, blocks, kbs, scale_words), T.int32)
        full = empty = None
        if tma_loads:
            # One arrival (the issuing thread; with a producer, its whole warpgroup) plus the TMA bytes;
            # with scale pairs, a second barrier per stage (``full[stages + stage]``) that the producer's
            # threads pass once they made the stage's pairs.
            full = T.alloc_barrier([WARPGROUP_THREADS if producer else 1] * stages + [WARPGROUP_THREADS] * (stages * scale_pairs))
            T.annotate_layout({x_tiles: make_full_bank_swizzled_layout(x_tiles)})  # TMA's 128-byte swizzle
        if producer:
            empty = T.alloc_barrier([consumer_threads] * stages)  # every consumer thread releases
        a_regs = T.alloc_local((2 * batch_a,), T.bfloat16)  # two halves: one in flight, one filling
        b_regs = T.alloc_local((32,), T.bfloat16)
        acc = T.alloc_local((acc_size,), T.float32)
        desc = T.alloc_wgmma_desc()
        T.import_source(device_source)
        T.initialize_wgmma_descriptor(desc, x_tiles.access_ptr("r"), SWIZZLE_128B, 1, SWIZZLE_ATOM_BYTES // 16)
        return x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc

    @T.macro
    def accumulate(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, m, tx):
        """The k tiles into ``acc``, whose loads were issued (or will be, by the producer)."""
        # Unrolled by two so that each half of the A registers has a fixed name. An odd first
        # tile runs alone and waits for its wgmma: left in flight into the loop (or peeled at
        # the end, or guarded inside it), it makes ptxas serialize every wgmma (C7513).
        if count % 2 == 1:
            k_tile(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, 0, 1, count, kt0, base, bm, bn, m, tx)
            T.warpgroup_wait(0)
        for t2 in T.serial(count // 2):
            for half in T.unroll(2):
                k_tile(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count % 2 + 2 * t2 + half, half, count, kt0, base, bm, bn, m, tx)
        T.warpgroup_wait(0)
        T.warpgroup_fence_operand(acc, num_regs=acc_size)

    @T.macro
    def segment(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, m, tx):
        for i in T.unroll(acc_size):
            acc[i] = 0.0
        for s in T.unroll(stages - 2):
            if s < count:
                load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, kt0 + s, (base + s) % stages, bm, bn, m, tx)
            elif not tma_loads:
                T.ptx_commit_group()
        accumulate(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, None, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, m, tx)
        if not tma_loads:
            T.ptx_wait_group(0)

    pair_words = blocks * kbs * scale_words  # scale words per stage, two pairs each

    @T.macro
    def make_pairs(scale_tiles, full, u, base, tx):
        """The producer's threads turn k tile ``u``'s scale words into pairs, once it has landed."""
        stage = (base + u) % stages
        T.mbarrier_wait_parity(full[stage], full_parity(base + u, stages))
        for i in T.unroll(T.ceildiv(pair_words, WARPGROUP_THREADS)):
            w = i * WARPGROUP_THREADS + tx - consumer_threads
            if w < pair_words:
                block, kb, word = w // (kbs * scale_words), w // scale_words % kbs, w % scale_words
                T.call_extern(
                    "handle",
                    "nvfp4_scale_pairs",
                    T.access_ptr(scale_tiles[stage, block, kb, word], "r", extent=1),
                    T.access_ptr(pair_slot(scale_tiles, stage, block, kb, 2 * word), "w", extent=2),
                )
        T.mbarrier_arrive(full[stages + stage])

    @T.macro
    def refill(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, t, kt0, base, bm, bn, m, tx):
        """The producer loads k tile ``t`` into its stage once the consumers freed it."""
        T.mbarrier_wait_parity(empty[(base + t) % stages], empty_parity(base + t, stages))
        load_stage(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, kt0 + t, (base + t) % stages, bm, bn, m, tx)

    @T.macro
    def produce(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, count, kt0, base, bm, bn, m, tx):
        # With scale pairs, tile u's pairs follow the load of tile u + PAIR_LAG: by then tile u has
        # mostly landed, and the loads still run ahead.
        if scale_pairs:
            for t in T.serial(count + PAIR_LAG):
                if t < count:
                    refill(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, t, kt0, base, bm, bn, m, tx)
                if t >= PAIR_LAG:
                    make_pairs(scale_tiles, full, t - PAIR_LAG, base, tx)
        else:
            for t in T.serial(count):
                refill(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, t, kt0, base, bm, bn, m, tx)

    @T.macro
    def consume(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, m, tx):
        """As ``segment``, the loads left to the producer; the last k tile's stage stays held: the
        caller releases it once ``store`` (which stages the output there) or the fix-up is done."""
        for i in T.unroll(acc_size):
            acc[i] = 0.0
        accumulate(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count, kt0, base, bm, bn, m, tx)

    sync_consumers = consumer_sync(consumer_threads, threads)
    # The output tile leaves through shared memory: stored straight from the accumulators, a warp's
    # BF16 values land 2 bytes apart in four x rows (the D-fragment layout), 1024 scattered stores per
    # CTA; staged, a thread stores 16 bytes of one x row and a warp whole 128-byte lines. H200
    # (2026-11-30, 16384 x K at M = 256, one 256-row tile per CTA): the scattered stores cost 5 us
    # per tile at every K, 8.5 % of the time at K = 5120. The x tile of one stage holds bk weight
    # rows of the output for each of its bx x rows, the 64-wide panel p holding rows 64p ..; so the
    # tile goes out in CTA_ROWS / bk passes.
    copy_out = example.row_chunk_copy(bx, bk, consumer_threads)  # one pass: bk weight rows of each x row

    def staged(stage, xl, wl):  # the stage's element of (x row xl, weight row wl of the tile)
        return stage * panels + wl // SWIZZLE_K % panels, xl, wl % SWIZZLE_K

    @T.macro
    def store(acc, x_tiles, stage, bm, bn, y, alpha_x128, m, tx, refilled: bool):
        """``acc`` times ``alpha * 2^7`` of its weight row, as BF16, to ``y`` rows below ``m``, through
        ``stage``'s x tile, which no wgmma or load may touch until this returns; ``refilled``: a load
        may follow (stream-K), so every copy must be done and ordered before it."""
        lane = tx % 32
        warp = tx // 32
        for h in T.unroll(rows // bk):
            sync_consumers()  # the stage's last readers are done: the wgmmas, or the previous pass
            for q in T.unroll(acc_size):
                if w_row(q, 0, lane, warp) // bk == h:
                    x_tiles[staged(stage, x_row(q, 0, lane), w_row(q, 0, lane, warp))] = T.cast(acc[q] * alpha_x128[w_row(q, bn, lane, warp)], T.bfloat16)
            sync_consumers()
            copy_out(y, lambda xl, wl: x_tiles[staged(stage, xl, h * bk + wl)], bm * bx, bn * rows + h * bk, m, tx)
        if refilled:
            sync_consumers()  # every copy is done before the stage is refilled
            T.fence_proxy_async()  # ... by TMA, an async-proxy write after these generic accesses

    registers = consumer_registers(wgs, producer_ctas, producer_registers)
    return WgmmaPipeline(
        acc_size, threads, consumer_threads, producer_registers, registers, sync_consumers, x_row, w_row, setup, segment, produce, consume, store
    )


# The widest x block whose kernels may compile the pipeline's k loop twice, each with a static trip
# count (stream-K's whole tiles and pieces, an uneven split's two counts): there the loop's overhead
# is a share of little work per k tile. The second loop body costs registers: wider blocks spilled
# (256 rows with a producer) or had their wgmmas serialized (48 rows, two CTAs per SM; C7512).
TWO_LOOPS_MAX_BLOCK_X = 32


# A split need not divide the k tiles: the first ``k_tiles % split_k`` splits take one k tile more
# (5120x17408 has 136 k tiles of 128 and 40 weight tiles: split 3 gives 120 CTAs of 45-46 k tiles,
# where split 4 would give 160 CTAs for 132 SMs). Where the x block is narrow
# (``TWO_LOOPS_MAX_BLOCK_X``) each of the two counts gets its own static k loop, as whole tiles do in
# stream-K; wider blocks run one loop with a run-time count.
def split_k_tiles(k_tiles: int, split_k: int, split_index, select=lambda c, a, b: a if c else b) -> tuple:
    """``(count, first k tile)`` of split ``split_index`` of ``k_tiles``; ``select(c, a, b)`` picks
    between run-time values (``T.if_then_else`` in a kernel)."""
    shortest, longer = divmod(k_tiles, split_k)
    count = select(split_index < longer, shortest + 1, shortest)
    return count, split_index * shortest + select(split_index < longer, split_index, longer)


def known_side(longer_split: bool):
    """``split_k_tiles``' select in a branch that knows whether its split is one of the longer ones:
    the count comes out static."""
    return lambda c, a, b: a if longer_split else b


def build_wgmma_kernel(n: int, k: int, config: WgmmaConfig):
    """The wgmma kernel for an ``N x K`` weight. Grid: (N / rows, split_k, ceil(M / block_x)): each
    CTA runs one ``wgmma_pipeline`` segment over its split's k tiles (``split_k_tiles``; with a
    producer: the producer loads them, the consumers run them), then stores or exchanges. With
    ``tail_k_tiles`` the grid is (tail CTAs + N / rows * split_k, ceil(M / block_x)): the tail CTAs
    first (``tail_pieces``), then each tile's splits of the k tiles before its tail, split fastest."""
    import tilelang.language as T

    bx, bk, stages, split_k, tail = config.block_x, config.block_k, config.stages, config.split_k, config.tail_k_tiles
    rows = CTA_ROWS
    tiles_n = n // rows
    main_k_tiles = k // bk - tail  # what the splits share
    longer = main_k_tiles % split_k  # splits with one k tile more (``split_k_tiles``)
    tails = tail_ctas(config, n)
    first_split = 1 if tail else 0  # a tile's tail is piece 0 of its exchange: the marked form's reducer is its last split
    pipe = wgmma_pipeline(
        bx, stages, config.tma_loads, config.warpgroups, bk, config.producer,
        producer_registers=LEAN_PRODUCER_REGISTERS, a_batches=config.a_batches, scale_pairs=config.scale_pairs,
    )  # fmt: skip
    threads, x_row = pipe.threads, pipe.x_row
    exchange = example.split_k_exchange(config.split_plan, pipe.consumer_threads, pipe.sync_consumers)
    M = T.dynamic("m")
    ops = example.operands(n, k, M)

    @T.macro
    def finish(acc, x_tiles, row_of, y, alpha_x128, partials, tickets, bm, bn, piece, last_stage, tx, refilled: bool):
        """The consumers' result, staged through ``last_stage`` (that of the piece's last k tile):
        stored, or exchanged and stored by the CTA that reduces the tile; ``refilled`` as ``store``'s."""
        if config.split_plan.split_k == 1:
            pipe.store(acc, x_tiles, last_stage, bm, bn, y, alpha_x128, M, tx, refilled)
        else:
            ticket = T.alloc_shared((1,), T.int32)
            exchange.run(acc, row_of, partials, tickets, ticket, bm * tiles_n + bn, piece, M, tx, True)
            if exchange.reduces(ticket, piece):
                pipe.store(acc, x_tiles, last_stage, bm, bn, y, alpha_x128, M, tx, refilled)

    @T.macro
    def run(x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers, bn, split_index, bm, tx, count, kt0):
        """This CTA's k tiles ``kt0 .. kt0 + count``, then its result."""
        x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc = stage_buffers
        row_of = lambda q: x_row(q, bm, tx % 32)  # noqa: E731
        last_stage = (count - 1) % stages
        piece = split_index + first_split
        if config.producer:  # the producer is done after its last load; the consumers finish
            if tx >= pipe.consumer_threads:
                T.set_max_nreg(pipe.producer_registers, 0)
                pipe.produce(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, count, kt0, 0, bm, bn, M, tx)
            else:
                T.set_max_nreg(pipe.consumer_registers, 1)
                pipe.consume(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, count, kt0, 0, bm, bn, M, tx)
                finish(acc, x_tiles, row_of, y, alpha_x128, partials, tickets, bm, bn, piece, last_stage, tx, False)
        else:
            pipe.segment(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, a_regs, b_regs, acc, desc, count, kt0, 0, bm, bn, M, tx)
            finish(acc, x_tiles, row_of, y, alpha_x128, partials, tickets, bm, bn, piece, last_stage, tx, False)

    @T.macro
    def run_split(x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers, bn, split_index, bm, tx):
        """Split ``split_index`` of tile ``bn``'s first ``main_k_tiles`` k tiles."""
        operands = (x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers, bn, split_index, bm, tx)
        if longer == 0:
            run(*operands, *split_k_tiles(main_k_tiles, split_k, split_index, known_side(False)))
        elif bx > TWO_LOOPS_MAX_BLOCK_X:
            run(*operands, *split_k_tiles(main_k_tiles, split_k, split_index, T.if_then_else))
        elif split_index < longer:  # each count static
            run(*operands, *split_k_tiles(main_k_tiles, split_k, split_index, known_side(True)))
        else:
            run(*operands, *split_k_tiles(main_k_tiles, split_k, split_index, known_side(False)))

    def tail_stage(i):  # the stage of the last k tile of a tail CTA's tail i
        return (i * tail + tail - 1) % stages

    @T.macro
    def run_tails(x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers, cta, bm, tx):
        """Tail CTA ``cta``: the tails of its tiles (``tail_pieces``), one segment each, the stages and
        their barrier phases running on from one to the next (``base``)."""
        x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc = stage_buffers
        row_of = lambda q: x_row(q, bm, tx % 32)  # noqa: E731
        first, count = tail_pieces(config, n, cta, T.min)
        if config.producer:
            if tx >= pipe.consumer_threads:
                T.set_max_nreg(pipe.producer_registers, 0)
                for i in T.serial(count):
                    pipe.produce(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, tail, main_k_tiles, i * tail, bm, first + i, M, tx)
            else:
                T.set_max_nreg(pipe.consumer_registers, 1)
                for i in T.serial(count):
                    pipe.consume(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, empty, a_regs, b_regs, acc, desc, tail, main_k_tiles, i * tail, bm, first + i, M, tx)
                    finish(acc, x_tiles, row_of, y, alpha_x128, partials, tickets, bm, first + i, 0, tail_stage(i), tx, True)
                    T.mbarrier_arrive(empty[tail_stage(i)])  # the stage ``consume`` held for the store
        else:
            for i in T.serial(count):
                pipe.segment(x, codes, scales, x_tiles, code_tiles, scale_tiles, full, a_regs, b_regs, acc, desc, tail, main_k_tiles, i * tail, bm, first + i, M, tx)
                T.sync_threads()  # every warp is done with the stages the next segment's prologue refills
                finish(acc, x_tiles, row_of, y, alpha_x128, partials, tickets, bm, first + i, 0, tail_stage(i), tx, True)

    @T.prim_func
    def nvfp4_w4a16_wgmma(
        x: ops.x,
        codes: ops.codes,
        scales: ops.scales,
        alpha_x128: ops.alpha_x128,
        y: ops.y,
        partials: ops.partials,
        tickets: ops.tickets,
    ):
        if tail:
            with T.Kernel(tails + tiles_n * split_k, T.ceildiv(M, bx), threads=threads) as (cta, bm):
                stage_buffers = pipe.setup()
                tx = T.get_thread_binding()
                operands = (x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers)
                if cta < tails:
                    run_tails(*operands, cta, bm, tx)
                else:
                    run_split(*operands, (cta - tails) // split_k, (cta - tails) % split_k, bm, tx)
        else:
            with T.Kernel(tiles_n, split_k, T.ceildiv(M, bx), threads=threads) as (bn, split_index, bm):
                stage_buffers = pipe.setup()
                tx = T.get_thread_binding()
                run_split(x, codes, scales, alpha_x128, y, partials, tickets, stage_buffers, bn, split_index, bm, tx)

    return nvfp4_w4a16_wgmma


# The kernel places every barrier itself (one per k tile, and the split-K exchange's): TileLang's
# automatic ones would add more. Its bounds are explicit too (the x loader's predicate or TMA's zero
# fill, the row guard of every store), as in the stream-K kernel: TileLang 0.1.15's safe-memory pass
# fails on hand-written cp.async loops for some shapes (16384 x 5120: "combined.defined()"). Warp
# specialization stays off as in the example.
HAND_PIPELINE_PASS_CONFIGS = {
    **example.PASS_CONFIGS,
    "tl.disable_thread_storage_sync": True,
    "tl.disable_safe_memory_legalize": True,
}


def compile_wgmma(n: int, k: int, config: WgmmaConfig):
    """Lower and compile for sm_90a; needs nvcc, not a GPU."""
    import tilelang

    check_wgmma_config(config, n, k)
    return tilelang.compile(
        build_wgmma_kernel(n, k, config), target={"kind": "cuda", "arch": WGMMA_ARCH}, pass_configs=HAND_PIPELINE_PASS_CONFIGS
    )


_KERNELS: dict = {}


def launch_wgmma(x: torch.Tensor, w: example.NVFP4W4A16Weight, config: WgmmaConfig, out: torch.Tensor) -> None:
    """One launch on checked inputs (at most 1024 rows); refuses any GPU but sm_90."""
    arch = example.device_arch(w.device)
    if arch != "sm_90":
        raise ValueError(f"config {config}: the wgmma kernel runs on sm_90 only, this GPU is {arch}")
    check_wgmma_config(config, w.n, w.k)
    key = (w.n, w.k, config, w.device.index)
    if key not in _KERNELS:
        _KERNELS[key] = compile_wgmma(w.n, w.k, config)
    partials, tickets = example.split_k_buffers(x, w, config.split_plan)
    _KERNELS[key](x, w.codes, w.scales, w.alpha_x128, out, partials, tickets)
