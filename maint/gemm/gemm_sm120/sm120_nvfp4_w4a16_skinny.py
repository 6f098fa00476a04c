"""The skinny kernel: NVFP4 W4A16 GEMM for a few rows of x (M <= 32), streamed from HBM by registers.

At decode sizes the GEMM is a read of the weights, and the SM's issue slots, not HBM, ran out first
in the kernels that stage every stage of codes through shared memory (NOTES, twenty-first session:
26 SASS instructions per 32-bit code word in the wgmma kernel's M = 1 loop, 21 in the fragment
kernel's). This kernel takes the shortest path from HBM to the tensor core:

- the weights are the MMA's **A** operand (m16 x k16 = 16 weight rows x 16 k), so one m16n8k16 MMA
  consumes a whole code word per thread, half the MMAs of the example's B-operand fragments. The
  prepared layout needs no change: words j and j + 1 of a lane's 16-byte block slice hold rows g and
  g + 8 of an m16 tile (see ``_scatter_codes`` in the example), registers ``2s`` and ``2s + 1`` of
  a word its k halves of k16 step s;
- each lane loads its 16 bytes of codes and 8 bytes of scales with ``ld.global.nc`` straight into
  registers, ``depth`` k32 blocks ahead. No shared-memory stage, no barrier and no proxy fence in
  the loop: each warp runs alone;
- x (``block_x`` rows of the CTA's K range) sits in shared memory in B-fragment order, one 16-byte
  load per lane, n8 tile and k32 block; lanes whose rows lie beyond ``block_x`` read 16 zero bytes.
  Or (``stage_x=False``) each warp streams its x rows through its own ring of ``depth`` k32 blocks
  in shared memory, ``cp.async`` ``depth`` blocks ahead with the weights and ``ldmatrix`` at use:
  no prologue, one 16-byte copy per lane, n8 tile and block;
- a CTA of ``warps`` warps: ``warps_n`` groups of them take different weight rows (sharing the
  staged x), and each group's warps split the CTA's K range and add their accumulators through
  shared memory; ``split_k`` CTAs per weight-row block meet in the example's deterministic
  ``split_k_exchange``;
- or (``SkinnyConfig.wgmma``, sm_90 only) the same weight loads and dequant feed wgmma as its
  register A operand, with x in a shared-memory ring the CTA's warpgroups read as the B operand: no
  x registers and one wgmma per m64 x k16 step for the warpgroup instead of an mma.sync per warp,
  n8 tile and k16 step.

SASS (sm_90a) of the loop for ``SkinnyConfig(1, 1, 2, 4, 4, 5)``: about 18 instructions per code
word, 15 of them the dequant (``nvfp4_dequant_block``). At M = 1 on 34816x5120 (H200, 2026-12-01)
the loop's design ran 27.7 us = 3.6 TB/s against 36.6 us for the tuned wgmma config; NOTES,
twenty-fifth session, has the probe and its configs.

Public surface: ``SkinnyConfig``, ``check_skinny_config``, ``compile_skinny`` and ``launch_skinny``;
the dispatch in ``sm120_nvfp4_w4a16_streamk`` routes a ``SkinnyConfig`` here.
"""

import pathlib
import sys
from typing import NamedTuple

import torch

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parents[2] / "examples" / "gemm_sm120"))
sys.path.insert(0, str(_HERE.parents[0] / "gemm_sm90"))

import sm120_nvfp4_w4a16_gemm as example  # noqa: E402
import sm90_nvfp4_w4a16_wgmma as hopper  # noqa: E402  (the H200's register and shared-memory limits)

# ----------------------------------------------------------------------------------------------
# 1. The config
# ----------------------------------------------------------------------------------------------

X_TILE_ROWS = 8  # an n8 MMA tile of x rows
MAX_BLOCK_X = 32  # four n8 tiles: past that the MMAs per code word outgrow the dequant
MIN_REGISTERS = 64  # below this ptxas spills the dequant's 16 registers next to the loads in flight
DEQUANT_REGISTERS = 16  # one weight block's dequantized words (nvfp4_dequant_block's output)
# A warp's x ring per n8 tile: the copy's source and byte count, the block's four fragment registers
# and what else ptxas took for them; fitted to ptxas -v (sm_90a, 2026-12-01): 12 let a config that
# spilled 4 bytes pass, 13 flags it.
X_RING_REGISTERS = 13
SMEM_PER_CTA = {"sm_90": hopper.SM90_SMEM_PER_CTA, "sm_120": example.SM120_SMEM_PER_CTA}
SMEM_PER_SM = {"sm_90": hopper.SM90_SMEM_PER_SM, "sm_120": example.SM120_SMEM_PER_SM}
ZERO_SLOT_BYTES = 16  # what lanes without an x row read: the first 16 bytes of the x buffer
ZERO_SLOT = ZERO_SLOT_BYTES // 2  # BF16 values before x's first (16-byte aligned) one
# The wgmma form (``SkinnyConfig.wgmma``, sm_90 only): the CTA is whole warpgroups whose warps each
# take their own weight rows over the same K range, and x is the wgmma's B operand in shared memory,
# in chunks of ``wgmma`` k32 blocks. A k32 block of x is ``block_x`` rows of 64 bytes with the 64-byte
# swizzle (16-byte chunk c of row r at chunk c ^ (r / 2) % 4), so a chunk starts on a 512-byte
# boundary (eight such rows). The ring holds WGMMA_X_SLOTS_BEHIND more chunks than it loads ahead: a
# slot is refilled once every warp has passed the wgmma wait that retires its last block's wgmma,
# which is one chunk after its own.
WGMMA_WARPS = hopper.WARPGROUP_THREADS // 32  # a warpgroup
# What the wgmma form's loop holds besides its operands (``registers_needed``): the weights' and
# x's pointers, the ring's fill address and slot, the descriptor. Fitted to ptxas -v (sm_90a,
# 2026-12-01, 34816x5120): of 11 configs at 8-32 rows, one or two blocks per warp and 4-5 CTAs per
# SM, every one that spilled needed more than 12 over the operand count, and none that fitted more
# than 16; 14 separates them all.
WGMMA_STATE_REGISTERS = 14
WGMMA_X_ALIGN = 512
WGMMA_X_SLOTS_BEHIND = 2


@example.config_type
class SkinnyConfig(NamedTuple):
    """``block_x`` rows of x the kernel holds (1-8, or 16, 24 or 32: whole n8 tiles; at least M),
    ``rows_per_warp`` 32-row weight blocks per warp (sharing its x fragments), ``split_k`` CTAs per
    weight-row block, ``warps`` per CTA in ``warps_n`` groups along N (each warp of a group a
    ``warps_n / warps`` slice of the CTA's K range; the groups share the staged x), ``depth`` k32
    blocks of codes and scales each lane keeps in flight, ``ctas_per_sm`` CTAs ptxas must fit on an
    SM (``__launch_bounds__``; it caps the registers), ``stage_x``: the CTA stages its x rows in
    shared memory first (else each warp copies its x rows into its own ring of ``depth`` k32 blocks
    in shared memory, ``depth`` blocks ahead with the weights: one 16-byte ``cp.async`` per lane, n8
    tile and block, read by ``ldmatrix``; no prologue, and shared memory for the ring only),
    ``wgmma``: 0 for the mma.sync form above, else the wgmma form (sm_90, whole warpgroups with
    ``warps_n = warps``, ``stage_x=False``; see WGMMA_SOURCE) with x in chunks of this many k32
    blocks, loaded ``max(1, depth // wgmma)`` chunks ahead; ``split_fastest``: the CTAs are numbered
    split first (blockIdx.x is the split), so that where the SM count is a multiple of ``split_k`` the
    CTAs an SM holds at once share one K range and read its x through L1 together (see
    ``build_skinny_kernel``); ``tail_tiles``: 0 to split every CTA column (weight-row block) ``split_k``
    ways, else only the last ``tail_tiles`` of them, the others running whole CTAs first (see
    ``build_skinny_kernel``: the tail evens out the SMs' work where the columns fill no whole wave);
    ``x_pairs``: the warps' rings (``stage_x=False``, an even ``depth`` of 4 or more) are filled two
    k32 blocks at a time, whole 128-byte lines per copy (see ``nvfp4_skinny_x``), x running
    ``depth - 1`` blocks ahead instead of ``depth``."""

    block_x: int = 1
    rows_per_warp: int = 1
    split_k: int = 2
    warps: int = 4
    depth: int = 4
    ctas_per_sm: int = 5
    stage_x: bool = True
    warps_n: int = 1
    wgmma: int = 0
    split_fastest: bool = False
    tail_tiles: int = 0
    x_pairs: bool = False

    FIELD_MINIMUMS = {"wgmma": 0, "tail_tiles": 0}  # wgmma 0: the mma.sync form; tail_tiles 0: no tail
    BLOCK_M_STEP = 1  # x rows come one at a time up to an n8 tile (checked in ``check_skinny_config``)
    SHARED_BYTES_PER_CTA = 1 << 30  # the example's check is not this kernel's: see ``shared_bytes``

    def kernel_shape(self) -> example.KernelShape:
        """The example's shape view, for its checks of the fields, the divisibility and the split:
        a k tile is one k32 block per warp, and each warp needs ``depth`` of them (the "stages")."""
        return example.KernelShape(
            self.block_x,
            self.rows_per_warp * self.warps_n * example.FRAG_N,
            self.warps_k * example.FRAG_K,
            1,
            self.warps_n,
            self.depth,
            self.split_k,
            self.warps_k,
        )

    @property
    def warps_k(self) -> int:
        """Warps per group, each a slice of the CTA's K range."""
        return self.warps // self.warps_n

    def pairs_fit(self) -> bool:
        """Whether ``x_pairs`` can fill this config's x: the warps' rings at an even depth of 4 or more."""
        return not self.stage_x and not self.wgmma and self.depth % 2 == 0 and self.depth >= 4

    @property
    def x_tiles(self) -> int:
        return -(-self.block_x // X_TILE_ROWS)

    @property
    def accumulators(self) -> int:
        """FP32 accumulators per thread: two m16 tiles per weight block, four per (m16, n8) tile."""
        return self.rows_per_warp * 2 * self.x_tiles * 4

    @property
    def split_plan(self) -> example.SplitPlan:
        """How the split pieces meet (``example.SplitPlan``): tiles of whole n8 tiles of x rows."""
        return example.SplitPlan(self.split_k, X_TILE_ROWS * self.x_tiles, self.accumulators)

    def columns(self, n: int) -> int:
        """CTA columns: blocks of ``32 rows_per_warp warps_n`` weight rows."""
        return n // (example.FRAG_N * self.rows_per_warp * self.warps_n)

    def ctas(self, n: int) -> int:
        """The grid's CTAs: ``split_k`` per column, or per tail column and one per other column."""
        return self.columns(n) + self.tail_tiles * (self.split_k - 1) if self.tail_tiles else self.columns(n) * self.split_k

    def cta_blocks(self, k: int, pieces: int = 0) -> int:
        """k32 blocks of a CTA's K range where a column is cut in ``pieces`` (default ``split_k``)."""
        return k // example.FRAG_K // (pieces or self.split_k)

    def warp_blocks(self, k: int, pieces: int = 0) -> int:
        """k32 blocks of a warp's K slice (``cta_blocks``)."""
        return self.cta_blocks(k, pieces) // self.warps_k

    def depth_within(self, k: int) -> "SkinnyConfig":
        """This config with its ring no deeper than a warp's k32 blocks at this K (at least 1)."""
        return self._replace(depth=max(1, min(self.depth, self.warp_blocks(k))))

    def x_elements(self, k: int) -> int:
        """BF16 elements of x in shared memory: the CTA's rows in fragment order (64 bytes per row and
        k32 block) if staged, the CTA's ring of x chunks in the wgmma form (``wgmma_slots``, plus the
        slack that aligns it to the swizzle), else the warps' rings (an n8 tile of a k32 block per
        tile and slot)."""
        if self.wgmma:
            return self.wgmma_slots(k) * self.wgmma * self.block_x * 32 + WGMMA_X_ALIGN // 2
        if self.stage_x:
            return self.cta_blocks(k) * self.block_x * 32
        return self.warps * self.depth * self.x_tiles * X_TILE_ROWS * 32

    def shared_bytes(self, k: int) -> int:
        """x (``x_elements``), the zero slot, the warps' handoff, the ticket exchange's ticket."""
        handoff = (self.warps - self.warps_n) * self.accumulators * 32 * 4
        return self.x_elements(k) * 2 + ZERO_SLOT_BYTES + handoff + 16

    def registers(self) -> int:
        """Registers per thread that ``ctas_per_sm`` CTAs leave (``hopper.registers_per_thread``)."""
        return hopper.registers_per_thread(self.warps, self.ctas_per_sm)

    def registers_needed(self) -> int:
        """What the loop holds at once per thread: the ring (codes 4 and scales 2 per weight block
        and slot), one block's dequantized words (two in the wgmma form, WGMMA_STATE_REGISTERS
        there), the accumulators and, with the warps' x rings, ``X_RING_REGISTERS`` per n8 tile.
        For the mma.sync form an estimate: against ptxas -v (sm_90a, 2026-12-01) on 96
        ring configs of 8-32 rows on 34816x5120 it put five that fitted up to 12 registers over the
        budget and one that spilled 8 bytes under it (NOTES, thirty-third session), so the tuner
        races configs within its ``SKINNY_REGISTER_SLACK``."""
        ring = self.depth * self.rows_per_warp * 6
        if self.wgmma:  # no x registers; the A registers of the block in flight and of the next
            return ring + 2 * DEQUANT_REGISTERS + self.accumulators + WGMMA_STATE_REGISTERS
        x_ring = 0 if self.stage_x else X_RING_REGISTERS * self.x_tiles
        return ring + DEQUANT_REGISTERS + self.accumulators + x_ring

    @property
    def wgmma_chunks_ahead(self) -> int:
        """x chunks the wgmma form loads ahead of the one in use: about as far as the weights."""
        return max(1, self.depth // self.wgmma)

    def wgmma_slots(self, k: int) -> int:
        """x chunks the wgmma form's ring holds: all of a warp's K slice where that is no more than it
        loads ahead, else ``wgmma_chunks_ahead + WGMMA_X_SLOTS_BEHIND``."""
        chunks = self.warp_blocks(k) // self.wgmma
        return chunks if chunks <= self.wgmma_chunks_ahead else self.wgmma_chunks_ahead + WGMMA_X_SLOTS_BEHIND

    def ctas_held(self, k: int, arch: str) -> int:
        """CTAs of this config that one ``arch`` SM's shared memory holds at this K."""
        return SMEM_PER_SM[arch] // (self.shared_bytes(k) + hopper.CTA_RESERVED_SMEM)


def block_x_for(m: int) -> int:
    """The fewest x rows a config for ``m`` rows holds: ``m`` up to an n8 tile, then whole n8 tiles."""
    return m if m <= X_TILE_ROWS else -(-m // X_TILE_ROWS) * X_TILE_ROWS


def _groups_divide_warps(config: SkinnyConfig) -> bool:
    return type(config.warps) is type(config.warps_n) is int and config.warps_n >= 1 and config.warps % config.warps_n == 0


def check_skinny_config(config: SkinnyConfig, n: int, k: int, arch: str) -> None:
    """Raise ``ValueError`` unless ``config`` divides an ``n x k`` weight and fits ``arch``."""
    # Before the example's check, which derives warps_k (warps // warps_n) for its own.
    if isinstance(config, SkinnyConfig) and not _groups_divide_warps(config):
        raise ValueError(f"config {config} does not fit N={n}, K={k}: warps_n must be a positive int that divides warps")
    example.check_config(config, n, k, (SkinnyConfig,))
    problems = []
    if config.block_x > X_TILE_ROWS and (config.block_x % X_TILE_ROWS or config.block_x > MAX_BLOCK_X):
        problems.append(f"block_x must be 1-{X_TILE_ROWS} or a multiple of {X_TILE_ROWS} up to {MAX_BLOCK_X}")
    if config.registers() < MIN_REGISTERS:
        problems.append(f"ctas_per_sm={config.ctas_per_sm} leaves {config.registers()} registers per thread, fewer than {MIN_REGISTERS}")
    if config.wgmma:
        if arch != "sm_90":
            problems.append("wgmma runs on sm_90 only")
        if config.warps != config.warps_n or config.warps % WGMMA_WARPS or config.stage_x:
            problems.append(f"wgmma takes whole warpgroups of {WGMMA_WARPS} warps, each its own weight rows (warps_n = warps), and stage_x=False")
        if config.block_x % X_TILE_ROWS:
            problems.append("wgmma takes block_x in whole n8 tiles (the wgmma N)")
        if config.warp_blocks(k) % config.wgmma:
            problems.append("wgmma's x chunks must divide a warp's k32 blocks")
    if config.x_pairs and not config.pairs_fit():
        problems.append("x_pairs needs the warps' rings (stage_x=False, wgmma=0) at an even depth of 4 or more")
    if config.tail_tiles and (config.split_k == 1 or config.stage_x or config.wgmma or config.tail_tiles >= config.columns(n)):
        problems.append(f"tail_tiles needs split_k > 1, stage_x=False, wgmma=0 and fewer tail columns than the {config.columns(n)} there are")
    smem = config.shared_bytes(k)
    if smem > SMEM_PER_CTA[arch] or config.ctas_per_sm > config.ctas_held(k, arch):
        problems.append(f"{config.ctas_per_sm} CTAs of {smem} bytes of shared memory do not fit an {arch} SM")
    if problems:
        raise ValueError(f"config {config} does not fit N={n}, K={k}: " + "; ".join(problems))


# Without a tuned entry (the dispatch's heuristic; sm_90 only, where the kernel was timed): four
# warps of one 32-row weight block each, 5 CTAs per SM (4 where the grid fits one wave of 4 per SM:
# HEURISTIC_ONE_WAVE_CTAS_PER_SM); x staged at M = 1, else through the warps' rings (one kernel serves
# M = 2-8 and one M = 9-16: the rings copy rows by M), at M = 9-16 filled in pairs of blocks
# (``x_pairs``) where a warp's blocks pair up (HEURISTIC_PAIRS_MIN_BLOCK_X); the smallest
# power-of-two split that gives at least HEURISTIC_MIN_CTAS_PER_SM CTAs per SM; a ring of
# HEURISTIC_DEEP_RING k32 blocks where a warp's K slice has HEURISTIC_DEEP_MIN_BLOCKS or more and x
# fits one n8 tile, else HEURISTIC_RING (8 deep at 16 rows needs more registers than 5 CTAs leave);
# the split index fastest (``split_fastest``) where the rings read x and the split divides the SM
# count, so that an SM's CTAs share one K range of x.
# Fitted to the tuner's timings on the H200 (2026-12-01; the five default shapes at M = 1, 4, 8, 16
# and four untuned ones, 4096x4096, 11008x4096, 4096x11008 and 6144x4096, at M = 1, 8, 16:
# results/h200_timings_2026-12-01{l_skinny_retune,m_odd_splits_m1-8,n_skinny_m16,p_untuned_skinny_m1-16}.json).
# Over those 32 cells the rule's configs took 1.016x the winners' summed time (at most 1.10x, 4096x4096
# M = 16). The CTA order was fitted later (2026-12-01w: 4096x4096, 4096x11008 and 6144x4096 re-timed at
# M = 1, 4, 8, 16, results/h200_timings_2026-12-01w_heuristic_split_fastest.json, and 5120x17408 and
# 5120x6144 from the re-tune of 2026-12-01v): over the 35 cells the rule takes 1.017x the winners' time
# with the split fastest and 1.031x without (4096x4096 M = 8: 6.73 us against 7.19). With x staged
# (M = 1) the order changed the times by 0.5 % or less, except on 4096x4096, where the split fastest
# was slower (6.36 against 6.24), so staged x keeps the split slowest. The rule before (3 CTAs per
# SM, depth 4, M <= 8; the wgmma kernels at M = 9-16) took 1.044x at M <= 8 and up to 1.39x per
# cell on the untuned shapes: 6144x4096 M = 8 ran 10.93 us at split 4 (768 CTAs, 1.16 waves of 660
# slots) against 7.89 at split 2, 11008x4096 M = 8 13.18 at split 2 against 10.35 unsplit and 8
# deep. At M = 9-16 the skinny kernel beat the wgmma kernel's heuristic on three of the four untuned
# shapes (11008x4096 12.28 us against 13.79, 4096x11008 14.64 against 16.52, 6144x4096 8.96 against
# 10.47) and lost 4096x4096 (8.58 against 8.23).
HEURISTIC_MAX_M = 2 * X_TILE_ROWS
HEURISTIC_MIN_CTAS_PER_SM = 2.5
HEURISTIC_WARPS = 4
HEURISTIC_RING = 4
HEURISTIC_DEEP_RING = 8
HEURISTIC_DEEP_MIN_BLOCKS = 32
HEURISTIC_CTAS_PER_SM = 5
# 4 CTAs per SM where the grid fits one wave of 4 per SM. The whole grid is resident either way, and
# the cap of 4 gives each thread 128 registers instead of 102 (ptxas fills the 96 it may use at 5 per
# SM at one n8 tile and at two); where the grid overflows 4 per SM the fifth slot saves a wave.
# Measured on the H200: at M = 16 (2026-12-01 timings and a race of the four untuned shapes,
# results/h200_timings_2026-12-03e_heuristic_race.json) 4 per SM ran 2-6 % faster in every cell
# whose grid fits 528 CTAs, and 16-29 % slower on 5120x17408 and 5120x6144 (640 CTAs) and 34816x5120
# (1088). At M = 1, 4 and 8 (results/h200_timings_2026-12-03f_heuristic_race_m1_8.json and
# h200_timings_2026-12-03g_heuristic_race_m4.json, the nine shapes) it was 0.6-6 % faster in 16 of
# the 18 cells that fit (6144x4096 M = 1 6.74 against 7.18 us, 11008x4096 M = 4 9.84 against 10.22),
# within 0.7 % in the other two (4096x4096 M = 1 and 8: 512 CTAs), and 4-18 % slower where the grid
# overflows.
HEURISTIC_ONE_WAVE_CTAS_PER_SM = 4
# x in pairs of k32 blocks (``x_pairs``) at two n8 tiles, where a warp's blocks are even (so that its
# pairs start on 128-byte lines). H200, 2026-12-03 (results/h200_ab_2026-12-03g_x_pairs.json, the
# heuristic's and the table's configs against their pair twins, 5 rounds): at M = 16 0.93-0.99x the
# time on seven shapes (5120x17408 17.71 against 19.03 us, 16384x5120 16.01 against 17.00, 6144x4096
# 8.01 against 8.41), but 1.01x on 4096x11008, whose 43 blocks per warp leave every other warp's
# pairs across lines; at one n8 tile 0.96-1.04x (5120x17408 M = 8 16.99 against 16.33), so not there.
# ncu (5120x17408 M = 16): L1/TEX 62 % busy against 76 %, the long-scoreboard stall per issue 3.0
# cycles against 5.5. With both rules, over the 36 cells of the races and the tuner's timings
# (results/h200_timings_2026-12-03h_heuristic_race_m16.json first: 34816x5120 M = 16 32.24 against
# 36.28 us without pairs) the heuristic takes 1.013x the winners' summed time, 1.039x without them.
HEURISTIC_PAIRS_MIN_BLOCK_X = 2 * X_TILE_ROWS
HEURISTIC_MAX_SPLIT = 8


def heuristic_config(m: int, n: int, k: int, *, sm_count: int) -> "SkinnyConfig | None":
    """The skinny config for ``m <= HEURISTIC_MAX_M`` rows of an ``n x k`` weight, or None where the
    shape does not divide into one (the caller falls back to the other kernels)."""
    if m > HEURISTIC_MAX_M:
        return None
    k_blocks = k // example.FRAG_K
    split = 1
    while n // example.FRAG_N * split < HEURISTIC_MIN_CTAS_PER_SM * sm_count and split < HEURISTIC_MAX_SPLIT and k_blocks % (2 * split * HEURISTIC_WARPS) == 0:
        split *= 2
    block_x = 1 if m == 1 else X_TILE_ROWS if m <= X_TILE_ROWS else HEURISTIC_MAX_M
    stage_x = m == 1
    split_fastest = split > 1 and not stage_x and sm_count % split == 0
    config = SkinnyConfig(block_x, 1, split, HEURISTIC_WARPS, HEURISTIC_RING, HEURISTIC_CTAS_PER_SM, stage_x=stage_x, split_fastest=split_fastest)
    if config.ctas(n) <= HEURISTIC_ONE_WAVE_CTAS_PER_SM * sm_count:
        config = config._replace(ctas_per_sm=HEURISTIC_ONE_WAVE_CTAS_PER_SM)
    if block_x <= X_TILE_ROWS and config.warp_blocks(k) >= HEURISTIC_DEEP_MIN_BLOCKS:
        config = config._replace(depth=HEURISTIC_DEEP_RING)
    config = config.depth_within(k)
    if block_x >= HEURISTIC_PAIRS_MIN_BLOCK_X and config.warp_blocks(k) % 2 == 0 and config.pairs_fit():
        config = config._replace(x_pairs=True)
    try:
        check_skinny_config(config, n, k, "sm_90")
    except ValueError:
        return None
    return config


# ----------------------------------------------------------------------------------------------
# 2. The kernel
# ----------------------------------------------------------------------------------------------

# The warp's loop, in CUDA: the loads must stay in registers ``depth`` blocks ahead of their use, an
# unrolled ring that TileLang's buffers would put in local memory. ``ld.global.nc.L1::no_allocate``:
# each byte of a weight is read once, so it should not evict x's lines from L1.
SKINNY_SOURCE = example.DEVICE_SOURCE + r"""
__device__ __forceinline__ uint4 nvfp4_skinny_ldg16(const int* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 nvfp4_skinny_ldg8(const int* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ void nvfp4_skinny_mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// x's B fragment order: register r of lane (g, t) for n8 tile j holds k = 8r + 2t, +1 of a k32
// block, row 8j + g (the k that register r of the lane's code words holds; see the example's
// _scatter_codes). Staged in shared memory it is 64 bytes per row and block, lane t's 16 at 16t.
//
// The CTA stages x into that order with this, 16 bytes of a row per thread and step (offsets in
// BF16 elements): four 4-byte cp.async copies, rows past M zero-filled (source size 0). The copies
// need no registers and no wait of their own, so each thread's are all in flight at once, and the
// warps issue their first weight loads before they wait (nvfp4_skinny_warp).
__device__ __forceinline__ void nvfp4_skinny_stage_x(const void* x, int src, void* x_frag, int dst, bool row_exists) {
  const unsigned short* s = reinterpret_cast<const unsigned short*>(x) + src;
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(reinterpret_cast<unsigned short*>(x_frag) + dst));
  const int bytes = row_exists ? 4 : 0;
#pragma unroll
  for (int w = 0; w < 4; ++w)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d + 16 * w), "l"(s + 2 * w), "r"(bytes) : "memory");
}
// One ring slot: the lane's codes and scales of one k32 block of each of the R weight blocks.
template <int R>
struct nvfp4_skinny_slot {
  uint4 cw[R];
  uint2 sw[R];
};
// Where a lane's x fragments come from. STAGED: the CTA's x rows, staged in shared memory before
// the loop, read at use (rows past BX read the 16 zero bytes at `zeros`).
template <int BX, int XT, bool STAGED, int D, bool PAIRS>
struct nvfp4_skinny_x {
  const char* p[XT];
  int step[XT];
  __device__ __forceinline__ nvfp4_skinny_x(const char* first, const void* zeros, int, int, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < XT; ++j) {
      const bool row = 8 * j + g < BX;
      p[j] = row ? first + ((8 * j + g) * 4 + t) * 16 : reinterpret_cast<const char*>(zeros);
      step[j] = row ? BX * 64 : 0;
    }
  }
  __device__ __forceinline__ void load(int, bool) {}
  __device__ __forceinline__ void skip() {}
  __device__ __forceinline__ void fetch(uint4 (&xv)[XT], int) {
#pragma unroll
    for (int j = 0; j < XT; ++j) {
      xv[j] = *reinterpret_cast<const uint4*>(p[j]);
      p[j] += step[j];
    }
  }
};
// Not staged: the warp's own ring of D blocks in shared memory, filled by cp.async D blocks ahead
// with the weights and read by ldmatrix. Slot d holds XT n8 tiles of 8 rows x 64 bytes (one k32
// block) in natural order, 16-byte chunk c of row g at chunk c ^ (g / 2) % 4, so that each 8-row
// phase of ldmatrix hits 32 distinct banks. ldmatrix.x4's matrix r (k 8r to 8r + 7) gives lane
// (g, t) k 8r + 2t, +1 of row g: register r of its B fragment. One cp.async group per block
// (empty ones past the last), so waiting for all but the newest D - 1 groups waits for the block
// about to be used.
template <int BX, int XT, int D>
struct nvfp4_skinny_x<BX, XT, false, D, false> {
  const char* src[XT];
  int bytes[XT];
  unsigned fill, read;
  __device__ __forceinline__ nvfp4_skinny_x(const char* first, const void* ring, int row_bytes, int m, int lane) {
    const int g = lane >> 2, c = lane & 3, r = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int j = 0; j < XT; ++j) {
      const bool exists = 8 * j + g < m;
      src[j] = first + (exists ? 8 * j + g : 0) * row_bytes + 16 * c;  // rows past M: a valid address, 0 bytes read
      bytes[j] = exists ? 16 : 0;
    }
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(ring));
    fill = base + g * 64 + ((c ^ (g >> 1)) & 3) * 16;
    read = base + rr * 64 + ((r ^ (rr >> 1)) & 3) * 16;
  }
  // The next block to load, into slot d (blocks are loaded and used in order).
  __device__ __forceinline__ void load(int d, bool) {
    __syncwarp();  // every lane has read the slot's last block
#pragma unroll
    for (int j = 0; j < XT; ++j) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(fill + (d * XT + j) * 512), "l"(src[j]), "r"(bytes[j]) : "memory");
      src[j] += 64;
    }
    skip();
  }
  __device__ __forceinline__ void skip() { asm volatile("cp.async.commit_group;" ::: "memory"); }
  // The next block's fragments, from slot d.
  __device__ __forceinline__ void fetch(uint4 (&xv)[XT], int d) {
    asm volatile("cp.async.wait_group %0;" ::"n"(D - 1) : "memory");
    __syncwarp();  // every lane's copies of the block have landed
#pragma unroll
    for (int j = 0; j < XT; ++j)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(xv[j].x), "=r"(xv[j].y), "=r"(xv[j].z), "=r"(xv[j].w) : "r"(read + (d * XT + j) * 512) : "memory");
  }
};
// The same ring (D even), filled two blocks at a time: a row's 64 bytes of one block are half a
// 128-byte line, and L1 writes shared memory one wavefront per line a copy touches, so per-block
// copies take twice the wavefronts their bytes need. Lane (q, c) copies 16-byte chunk c (0-7) of the
// pair's rows q and q + 4 of each n8 tile: chunk c % 4 of block c / 4. An odd slot keeps row g at
// row g ^ 1's place, so that a row's two blocks land on opposite halves of the banks. The pair of
// slots d - 1, d is refilled after the use of d (both used), so x runs D - 1 blocks ahead; a last
// odd block is copied alone.
template <int BX, int XT, int D>
struct nvfp4_skinny_x<BX, XT, false, D, true> {
  static_assert(D % 2 == 0, "pairs of slots");
  const char* src[XT];
  int second[XT];  // bytes from row q to row q + 4 (0 where row q + 4 is past M: a valid address)
  int bytes[XT][2];
  unsigned fill[2], read[2];
  __device__ __forceinline__ nvfp4_skinny_x(const char* first, const void* ring, int row_bytes, int m, int lane) {
    const int q = lane >> 3, c = lane & 3, h = (lane >> 2) & 1, r = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int j = 0; j < XT; ++j) {
      const bool exists = 8 * j + q < m, exists4 = 8 * j + q + 4 < m;
      src[j] = first + (exists ? 8 * j + q : 0) * row_bytes + 16 * (lane & 7);
      second[j] = exists4 ? 4 * row_bytes : 0;
      bytes[j][0] = exists ? 16 : 0;
      bytes[j][1] = exists4 ? 16 : 0;
    }
    const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(ring)) + h * XT * 512;
    fill[0] = base + (q ^ h) * 64 + ((c ^ (q >> 1)) & 3) * 16;
    fill[1] = base + ((q + 4) ^ h) * 64 + ((c ^ ((q + 4) >> 1)) & 3) * 16;
    const unsigned rbase = static_cast<unsigned>(__cvta_generic_to_shared(ring)) + ((r ^ (rr >> 1)) & 3) * 16;
    read[0] = rbase + rr * 64;
    read[1] = rbase + (rr ^ 1) * 64;
  }
  // After the use of slot d: slots d - 1 and d take the next two blocks (d odd); an even d takes its
  // next block alone where it is the `last` one, else waits for its pair.
  __device__ __forceinline__ void load(int d, bool last) {
    if (d % 2 || last) {
      __syncwarp();  // every lane has read the slots' last blocks
      const int first_slot = d - d % 2;
      if (d % 2 || (threadIdx.x & 4) == 0) {  // alone: only the lanes of the first block's chunks
#pragma unroll
        for (int j = 0; j < XT; ++j)
#pragma unroll
          for (int i = 0; i < 2; ++i)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(fill[i] + (first_slot * XT + j) * 512), "l"(src[j] + (i ? second[j] : 0)),
                         "r"(bytes[j][i]) : "memory");
      }
#pragma unroll
      for (int j = 0; j < XT; ++j) src[j] += 128;
    }
    skip();
  }
  __device__ __forceinline__ void skip() { asm volatile("cp.async.commit_group;" ::: "memory"); }
  // The next block's fragments, from slot d: its pair's group is the newest but D - 2.
  __device__ __forceinline__ void fetch(uint4 (&xv)[XT], int d) {
    asm volatile("cp.async.wait_group %0;" ::"n"(D - 2) : "memory");
    __syncwarp();
#pragma unroll
    for (int j = 0; j < XT; ++j)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                   : "=r"(xv[j].x), "=r"(xv[j].y), "=r"(xv[j].z), "=r"(xv[j].w) : "r"(read[d % 2] + (d * XT + j) * 512) : "memory");
  }
};
// One k32 block: dequantize each weight block's lane slice (words j: rows 8j + g) and multiply.
// m16 tile p takes words 2p (rows g) and 2p + 1 (rows g + 8); register 2s + h of a word holds
// k = 16s + 8h + 2t, +1: the A fragment {a0, a1, a2, a3} of step s is (2p, 2s), (2p + 1, 2s),
// (2p, 2s + 1), (2p + 1, 2s + 1). x's B fragment of step s is (xv.x, xv.y) or (xv.z, xv.w).
template <int R, int XT>
__device__ __forceinline__ void nvfp4_skinny_block(const uint4 (&cw)[R], const uint2 (&sw)[R], const uint4 (&xv)[XT], float* acc) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    unsigned b[16];
    nvfp4_dequant_block(&cw[r], &sw[r], b);
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
      for (int j = 0; j < XT; ++j)
#pragma unroll
        for (int s = 0; s < 2; ++s)
          nvfp4_skinny_mma(acc + ((r * 2 + p) * XT + j) * 4, b[8 * p + 2 * s], b[8 * p + 4 + 2 * s], b[8 * p + 2 * s + 1],
                           b[8 * p + 4 + 2 * s + 1], s ? xv[j].z : xv[j].x, s ? xv[j].w : xv[j].y);
  }
}
// Weight block r's (`block_stride` code words after block 0) block at cp, sp into its place in a slot.
template <int R>
__device__ __forceinline__ void nvfp4_skinny_load_block(nvfp4_skinny_slot<R>& slot, int r, const int* cp, const int* sp, int block_stride) {
  slot.cw[r] = nvfp4_skinny_ldg16(cp + r * block_stride);
  slot.sw[r] = nvfp4_skinny_ldg8(sp + r * (block_stride / 8));  // 16 scale words per block against 128 code words
}
// The R weight blocks' block at cp, sp into ring slot d, and x's.
template <int R, class XS>
__device__ __forceinline__ void nvfp4_skinny_load(nvfp4_skinny_slot<R>& slot, int d, const int* cp, const int* sp, int block_stride, XS& xs, bool last) {
#pragma unroll
  for (int r = 0; r < R; ++r) nvfp4_skinny_load_block(slot, r, cp, sp, block_stride);
  xs.load(d, last);
}
// The next block, from ring slot d.
template <int R, int XT, class XS>
__device__ __forceinline__ void nvfp4_skinny_use(const nvfp4_skinny_slot<R>& slot, int d, XS& xs, float* acc) {
  uint4 xv[XT];
  xs.fetch(xv, d);
  nvfp4_skinny_block<R, XT>(slot.cw, slot.sw, xv, acc);
}
// A CTA's warp: its COUNT k32 blocks (at least D) of R weight blocks, `block_stride` words apart,
// from `block_offset` code words into the weight, into `acc`. STAGED: the CTA has staged its x rows
// into `x_frag` after a 16-byte zero slot; this warp's blocks start `x_block` blocks in. Else the
// warp reads x from column x_col + 32 x_block on, through its ring after the zero slot.
// Offsets count elements. They travel apart from the bases: inside an address_of, TileLang's
// pointer-type pass (VectorTypeAccessChecker) failed on indices past 64K elements ("can't fetch
// the lanes of a scalable vector"; the codes of two-warp CTAs at K = 17408).
template <int R, int D, int BX, int XT, bool STAGED, bool PAIRS, int COUNT>
__device__ __forceinline__ void nvfp4_skinny_warp(const int* code_base, const int* scale_base, int block_offset, const void* x, int x_col,
                                                  int row_stride, int m, const void* x_frag, int x_block, float* acc, int block_stride, int tx) {
  static_assert(COUNT >= D, "a warp's blocks fill its ring at least once");
  const int lane = tx & 31;
  const int* cp = code_base + block_offset + lane * 4;  // block_offset counts code words; scales have 1/8 as many
  const int* sp = scale_base + block_offset / 8 + (lane >> 2) * 2;
  const unsigned short* shared_x = reinterpret_cast<const unsigned short*>(x_frag);
  const unsigned short* first = STAGED ? shared_x + ZERO_SLOT + x_block * BX * 32 : reinterpret_cast<const unsigned short*>(x) + x_col + x_block * 32;
  const unsigned short* x_ring = shared_x + ZERO_SLOT + (threadIdx.x >> 5) * D * XT * 256;
  // Staged x is read at its uses; the ring is filled at the loads.
  nvfp4_skinny_x<BX, XT, STAGED, D, PAIRS> xs(reinterpret_cast<const char*>(first), STAGED ? shared_x : x_ring, row_stride * 2, m, lane);
  nvfp4_skinny_slot<R> ring[D];
#pragma unroll
  for (int d = 0; d < D; ++d) nvfp4_skinny_load(ring[d], d, cp + d * 128, sp + d * 16, block_stride, xs, false);
  if (STAGED) {  // the CTA's x copies (nvfp4_skinny_stage_x) and its zero slot, in shared memory for all warps
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
  }
  // Blocks are used in order; slot d takes every D-th. While whole rings remain: use a slot, then
  // refill it D blocks ahead.
  constexpr int TAIL = COUNT % D;
  for (int i0 = D; i0 + D <= COUNT; i0 += D) {
    cp += D * 128;
    sp += D * 16;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      nvfp4_skinny_use<R, XT>(ring[d], d, xs, acc);
      nvfp4_skinny_load(ring[d], d, cp + d * 128, sp + d * 16, block_stride, xs, false);
    }
  }
  // The last whole ring; the TAIL blocks past it refill its first slots. A use without a refill is
  // followed by an empty group of x copies, so that every use waits for the same count.
  cp += D * 128;
  sp += D * 16;
#pragma unroll
  for (int d = 0; d < D; ++d) {
    nvfp4_skinny_use<R, XT>(ring[d], d, xs, acc);
    if (d < TAIL)
      nvfp4_skinny_load(ring[d], d, cp + d * 128, sp + d * 16, block_stride, xs, d == TAIL - 1);
    else
      xs.skip();
  }
#pragma unroll
  for (int d = 0; d < TAIL; ++d) {
    nvfp4_skinny_use<R, XT>(ring[d], d, xs, acc);
    xs.skip();
  }
}
""".replace("ZERO_SLOT", str(ZERO_SLOT))


def _wgmma_mma_source(x_tiles: int) -> str:
    """``nvfp4_skinny_wgmma_mma<x_tiles>``: one m64nNk16 wgmma (N = 8 x_tiles) into ``d`` (N / 2 FP32
    accumulators per thread), A from the four registers, B (x) by the shared-memory descriptor."""
    regs = 4 * x_tiles
    d = ",".join(f"%{i}" for i in range(regs))
    a = ",".join(f"%{regs + i}" for i in range(4))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return f"""
template <> __device__ __forceinline__ void nvfp4_skinny_wgmma_mma<{x_tiles}>(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned long long desc) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{8 * x_tiles}k16.f32.bf16.bf16 {{{d}}}, {{{a}}}, %{regs + 4}, p, 1, 1, 0;\\n}}"
               : {outs} : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}}"""


# The wgmma form's loop (sm_90a). Per k32 block and weight block a warp dequantizes its lane slice
# into A registers (the m16n8k16 A fragment is also a warp's quarter of wgmma's m64 A), and its
# warpgroup issues one m64 wgmma per (m16 half p, k16 step s): atom p's row 16w + r is row 16p + r of
# warp w's block, so the accumulators keep the mma.sync form's order (``output_cell``). Each block's
# wgmmas run while the next one is dequantized (wait_group 1): ptxas keeps the two blocks' A
# registers apart (no C7512/C7513 serialization for the tuner's shapes; a test checks). x comes
# through the CTA's ring (``wgmma_slots``) in chunks of CB k32 blocks, cp.async XA chunks ahead; one
# CTA barrier per chunk publishes it, after each thread's proxy fence (cp.async writes through the
# generic proxy, wgmma reads through the async one), and then the slot of chunk c - 2 is refilled.
WGMMA_SOURCE = r"""
template <int XT> __device__ __forceinline__ void nvfp4_skinny_wgmma_mma(float*, unsigned, unsigned, unsigned, unsigned, unsigned long long);
""" + "".join(_wgmma_mma_source(t) for t in range(1, MAX_BLOCK_X // X_TILE_ROWS + 1)) + r"""
// Empty asm that "changes" registers: the compiler may not move their reads or writes across the
// (volatile) wgmma fence, issue and wait, which it otherwise sees no dependency on.
template <int R> __device__ __forceinline__ void nvfp4_skinny_fence_f(float* r) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int R> __device__ __forceinline__ void nvfp4_skinny_fence_u(unsigned* r) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// K-major B, 64-byte swizzle (layout type 2), WGMMA_X_ALIGN bytes between 8-row groups (the stride
// byte offset; the leading one is unused with a swizzle); addresses in 16-byte units.
__device__ __forceinline__ unsigned long long nvfp4_skinny_x_desc(unsigned addr) {
  return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (static_cast<unsigned long long>(WGMMA_X_ALIGN >> 4) << 32) | (2ull << 62);
}
// A chunk of CB k32 blocks, each BX rows of 64 bytes; thread tx copies 16 bytes of row tx / 4 of each
// block (one 16-byte chunk of the row, at its swizzled place).
template <int BX, int CB>
struct nvfp4_skinny_wgmma_x {
  const char* src;
  int bytes;
  unsigned fill;
  bool copies;
  __device__ __forceinline__ nvfp4_skinny_wgmma_x(const char* first, unsigned ring, int row_bytes, int m, int tx) {
    const int row = tx >> 2, c = tx & 3;
    copies = row < BX;
    src = first + (row < m ? row : 0) * row_bytes + 16 * c;  // rows past M: a valid address, 0 bytes read
    bytes = row < m ? 16 : 0;
    fill = ring + row * 64 + ((c ^ (row >> 1)) & 3) * 16;
  }
  __device__ __forceinline__ void load(int slot) {
    if (copies) {
#pragma unroll
      for (int b = 0; b < CB; ++b)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(fill + (slot * CB + b) * BX * 64), "l"(src + 64 * b), "r"(bytes) : "memory");
    }
    src += 64 * CB;
    skip();
  }
  __device__ __forceinline__ void skip() { asm volatile("cp.async.commit_group;" ::: "memory"); }
};
// Thread tx's warp, with nvfp4_skinny_warp's arguments: its COUNT k32 blocks of R weight blocks
// (`block_stride` words apart) from `block_offset` code words on, the ring D blocks deep, into `acc`;
// x from column x_col + 32 x_block on, through the CTA's ring of XS slots at `x_ring`.
template <int R, int D, int BX, int XT, int XA, int XS, int CB, int COUNT>
__device__ __forceinline__ void nvfp4_skinny_wgmma(const int* code_base, const int* scale_base, int block_offset, const void* x, int x_col,
                                                   int row_stride, int m, const void* x_ring, int x_block, float* acc, int block_stride, int tx) {
  static_assert(COUNT >= D && COUNT % CB == 0, "a warp's blocks fill its ring at least once and make whole x chunks");
  constexpr int CHUNKS = COUNT / CB;
  const int lane = tx & 31;
  const int* cp = code_base + block_offset + lane * 4;
  const int* sp = scale_base + block_offset / 8 + (lane >> 2) * 2;
  const unsigned ring = (static_cast<unsigned>(__cvta_generic_to_shared(x_ring)) + WGMMA_X_ALIGN - 1) & ~(WGMMA_X_ALIGN - 1u);
  nvfp4_skinny_wgmma_x<BX, CB> xs(reinterpret_cast<const char*>(reinterpret_cast<const unsigned short*>(x) + x_col + x_block * 32), ring, row_stride * 2, m, tx);
  const unsigned long long desc = nvfp4_skinny_x_desc(ring);
  nvfp4_skinny_slot<R> codes[D];
#pragma unroll
  for (int d = 0; d < D; ++d)
#pragma unroll
    for (int r = 0; r < R; ++r) nvfp4_skinny_load_block(codes[d], r, cp + d * 128, sp + d * 16, block_stride);
#pragma unroll
  for (int a = 0; a < XA; ++a) {
    if (a < CHUNKS) xs.load(a); else xs.skip();
  }
  nvfp4_skinny_fence_f<8 * XT * R>(acc);
  int slot = 0;  // x's slot of the chunk in use
  for (int i0 = 0; i0 < COUNT; i0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const int i = i0 + d;
      if (COUNT % D == 0 || i < COUNT) {
        const int c = i / CB;
        if (i % CB == 0) {  // a new chunk: wait for it, and refill the slot of chunk c - 2
          if (XS > 1 || c == 0) {
            asm volatile("cp.async.wait_group %0;" ::"n"(XA - 1) : "memory");  // this thread's copies of chunk c
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");      // ... visible to the wgmma
            __syncthreads();  // everyone's copies landed; every warp retired chunk c - 2's wgmma
          }
          if (c > 0) slot = slot + 1 == XS ? 0 : slot + 1;
          const int refill = slot >= 2 ? slot - 2 : slot + XS - 2;
          if (c + XA < CHUNKS) xs.load(refill); else xs.skip();
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          unsigned b[16];
          nvfp4_dequant_block(&codes[d].cw[r], &codes[d].sw[r], b);
          if (i + D < COUNT) nvfp4_skinny_load_block(codes[d], r, cp + (i + D) * 128, sp + (i + D) * 16, block_stride);
          nvfp4_skinny_fence_u<16>(b);
          asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
          for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int s = 0; s < 2; ++s)
              nvfp4_skinny_wgmma_mma<XT>(acc + (r * 2 + p) * XT * 4, b[8 * p + 2 * s], b[8 * p + 4 + 2 * s], b[8 * p + 2 * s + 1],
                                         b[8 * p + 4 + 2 * s + 1], desc + ((slot * CB * BX * 64 + i % CB * BX * 64 + s * 32) >> 4));
          asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // the previous block's wgmma is done
        }
        nvfp4_skinny_fence_f<8 * XT * R>(acc);
      }
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  nvfp4_skinny_fence_f<8 * XT * R>(acc);
}
""".replace("WGMMA_X_ALIGN", str(WGMMA_X_ALIGN))


# Who reads and writes what. Plain arithmetic, so the kernel (on TIR expressions) and the CPU tests
# (on ints) run the same formulas.
def warp_range(config: SkinnyConfig, k: int, bn, bk, warp, pieces: int = 0) -> tuple:
    """``(weight block, k32 block, k32 blocks)``: the first of the ``rows_per_warp`` 32-row weight
    blocks that warp ``warp`` of CTA ``(bn, bk)`` (column ``bn``, piece ``bk`` of ``pieces``, by
    default ``split_k``) reads, its first k32 block and how many. Warp w is in group ``w % warps_n``
    (its weight rows) and takes K slice ``w // warps_n`` of the CTA's range."""
    warp_blocks = config.warp_blocks(k, pieces)
    group, k_slice = warp % config.warps_n, warp // config.warps_n
    return (bn * config.warps_n + group) * config.rows_per_warp, bk * config.cta_blocks(k, pieces) + k_slice * warp_blocks, warp_blocks


def tail_piece(config: SkinnyConfig, n: int, t) -> tuple:
    """``(column, piece)`` of the tail's CTA ``t`` (``tail_tiles``): the grid's first ``columns(n) -
    tail_tiles`` CTAs take one whole column each, then come the last ``tail_tiles`` columns'
    ``split_k`` pieces, split index fastest or slowest (``split_fastest``)."""
    whole = config.columns(n) - config.tail_tiles
    if config.split_fastest:
        return whole + t // config.split_k, t % config.split_k
    return whole + t % config.tail_tiles, t // config.tail_tiles


def output_cell(config: SkinnyConfig, bn, group, q, lane) -> tuple:
    """``(x row, weight row)`` of accumulator ``q`` of lane ``lane`` in an owner warp of group
    ``group``, CTA column ``bn``: ``q = ((r * 2 + p) * x_tiles + j) * 4 + c`` of lane (g, t) holds
    weight row ``32 (block r) + 16 p + g + 8 (c // 2)`` of the group's blocks and x row
    ``8 j + 2 t + c % 2`` (the m16n8 C fragment with the weights as rows)."""
    x_tiles = config.x_tiles
    block = (bn * config.warps_n + group) * config.rows_per_warp + q // (8 * x_tiles)
    weight_row = block * example.FRAG_N + q // (4 * x_tiles) % 2 * 16 + lane // 4 + q % 4 // 2 * 8
    return q // 4 % x_tiles * X_TILE_ROWS + lane % 4 * 2 + q % 2, weight_row


def build_skinny_kernel(n: int, k: int, config: SkinnyConfig):
    """Grid: (N / (32 rows_per_warp warps_n), split_k), or (split_k, N / ...) with ``split_fastest``;
    ``warps`` warps per CTA; each warp reads ``warp_range``, and the owner warps (K slice 0 of each
    group) write ``output_cell``s.

    The order matters where an SM holds CTAs of several K ranges at once. The H200 hands out CTAs in
    blockIdx order, one per SM in turn (observed, not documented), so CTAs i and i + 132 share an SM.
    Split slowest, a shape with fewer weight-row blocks than a wave holds (N = 5120: 160) puts CTAs
    of different K ranges on each SM, each streaming its own x. Split fastest at split 3 or 4 (which
    divide 132), an SM's CTAs share one K range. H200, 2026-12-01 (table configs and their split
    variants at M = 4-24 on the five default shapes; results/h200_ab_2026-12-01v_split_fastest.json):
    split fastest took 0.92-1.01x the time at split 4 (faster in 20 of 22 cells) and 0.97-0.99x at
    split 3, but 0.97-1.04x at split 2, where the wide shapes' waves hold one K range either way, and
    0.93-1.11x at split 8."""
    import tilelang.language as T

    bx, rpw, split_k, warps, depth = config.block_x, config.rows_per_warp, config.split_k, config.warps, config.depth
    warps_n, warps_k = config.warps_n, config.warps_k
    x_tiles, acc_size = config.x_tiles, config.accumulators
    columns = config.columns(n)
    whole_columns = columns - config.tail_tiles  # the columns that run as one CTA each
    k_blocks = k // example.FRAG_K
    block_stride = k_blocks * example.WORDS_PER_BLOCK
    x_elements = config.x_elements(k)  # staged: [k32 block][x row][t][register][half]
    x_chunks = x_elements // 8
    exchange = example.split_k_exchange(config.split_plan, 32 * warps_n)
    M = T.dynamic("m")
    ops = example.operands(n, k, M)

    def x_row(q, lane):
        return output_cell(config, 0, 0, q, lane)[0]

    @T.macro
    def store(acc, y, alpha_x128, bn, group, lane, m):
        for q in T.unroll(acc_size):
            row, weight_row = output_cell(config, bn, group, q, lane)
            if row < m:
                y[row, weight_row] = T.cast(acc[q] * alpha_x128[weight_row], T.bfloat16)

    @T.macro
    def column_piece(x, codes, scales, alpha_x128, y, partials, tickets, x_frag, handoff, ticket, acc, tx, bn, bk, pieces, tail_column):
        """Piece ``bk`` of ``pieces`` (a Python int) of column ``bn``; split pieces meet in the
        exchange as its tile ``tail_column``."""
        lane = tx % 32
        warp = tx // 32
        weight_block, k_block, warp_k_blocks = warp_range(config, k, bn, bk, warp, pieces)
        cta_k_blocks = config.cta_blocks(k, pieces)
        if config.stage_x:
            # 16 bytes of an x row per thread and step: (k32 block, row, register r) = chunk c,
            # copied asynchronously; the warps wait for them after their first weight loads.
            # Against a 16-byte load and four shared stores per chunk (H200, 2026-12-01,
            # results/h200_ab_2026-12-01h_x_staging.json): 0.95-0.99x the time at M = 1 on four
            # shapes, but 1.00-1.19x with 4-32 rows staged (four copies per chunk; the table
            # stages x only at M = 1). Rows in natural order read by ldmatrix.x4 lost at M = 1
            # (1.16x on 34816x5120).
            for i in T.serial(T.ceildiv(x_chunks, 32 * warps)):
                c = i * 32 * warps + tx
                if c < x_chunks:
                    row = c // 4 % bx
                    col = (bk * cta_k_blocks + c // (4 * bx)) * example.FRAG_K + c % 4 * 8
                    T.call_extern(
                        "handle",
                        "nvfp4_skinny_stage_x",
                        T.address_of(x[0, 0]),
                        T.min(row, M - 1) * k + col,
                        T.address_of(x_frag[0]),
                        ZERO_SLOT + c // 4 * 32 + c % 4 * 2,
                        row < M,
                    )
            if tx < ZERO_SLOT:
                x_frag[tx] = T.bfloat16(0)
        for q in T.unroll(acc_size):
            acc[q] = 0.0
        if config.wgmma:
            body = f"nvfp4_skinny_wgmma<{rpw}, {depth}, {bx}, {x_tiles}, {config.wgmma_chunks_ahead}, {config.wgmma_slots(k)}, {config.wgmma}, {warp_k_blocks}>"
        else:
            body = f"nvfp4_skinny_warp<{rpw}, {depth}, {bx}, {x_tiles}, {str(config.stage_x).lower()}, {str(config.x_pairs).lower()}, {warp_k_blocks}>"
        T.call_extern(
            "handle",
            body,
            T.address_of(codes[0, 0, 0]),
            T.address_of(scales[0, 0, 0]),
            (weight_block * k_blocks + k_block) * example.WORDS_PER_BLOCK,
            T.address_of(x[0, 0]),
            bk * cta_k_blocks * example.FRAG_K,
            k,
            M,
            T.address_of(x_frag[0]),
            k_block - bk * cta_k_blocks,
            T.address_of(acc[0]),
            block_stride,
            tx,
        )
        owner = warp < warps_n  # K slice 0 of its group (warp_range): it holds the group's sums
        if warps_k > 1:
            # Warp order, lane-fastest: each warp's stores and each owner's loads hit 32 banks.
            if not owner:
                for q in T.unroll(acc_size):
                    handoff[warp - warps_n, q, lane] = acc[q]
            T.sync_threads()
            if owner:
                for w, q in T.grid(warps_k - 1, acc_size):
                    acc[q] += handoff[w * warps_n + warp, q, lane]
        if pieces == 1:
            if owner:
                store(acc, y, alpha_x128, bn, warp, lane, M)
        else:
            exchange.run(acc, lambda q: x_row(q, lane), partials, tickets, ticket, tail_column, bk, M, tx, owner)
            if exchange.reduces(ticket, bk) and owner:
                store(acc, y, alpha_x128, bn, warp, lane, M)

    @T.prim_func
    def nvfp4_w4a16_skinny(
        x: ops.x,
        codes: ops.codes,
        scales: ops.scales,
        alpha_x128: ops.alpha_x128,
        y: ops.y,
        partials: ops.partials,
        tickets: ops.tickets,
    ):
        grid = (config.ctas(n),) if config.tail_tiles else (split_k, columns) if config.split_fastest else (columns, split_k)
        with T.Kernel(*grid, threads=32 * warps) as ctas:
            T.import_source(SKINNY_SOURCE + (WGMMA_SOURCE if config.wgmma else ""))
            T.annotate_min_blocks_per_sm(config.ctas_per_sm)
            x_frag = T.alloc_shared((x_elements + ZERO_SLOT,), T.bfloat16)
            handoff = T.alloc_shared((max(warps - warps_n, 1), acc_size, 32), T.float32)
            ticket = T.alloc_shared((1,), T.int32)
            acc = T.alloc_local((acc_size,), T.float32)
            tx = T.get_thread_binding()
            buffers = (x, codes, scales, alpha_x128, y, partials, tickets, x_frag, handoff, ticket, acc, tx)
            if config.tail_tiles:
                if ctas < whole_columns:
                    column_piece(*buffers, ctas, 0, 1, 0)
                else:
                    bn, bk = tail_piece(config, n, ctas - whole_columns)
                    column_piece(*buffers, bn, bk, split_k, bn - whole_columns)
            else:
                bn, bk = (ctas[1], ctas[0]) if config.split_fastest else ctas
                column_piece(*buffers, bn, bk, split_k, bn)

    return nvfp4_w4a16_skinny


def compile_skinny(n: int, k: int, config: SkinnyConfig, arch: str):
    """Lower and compile for ``arch`` (sm_90 compiles as sm_90a, like the other kernels there); needs
    nvcc, not a GPU."""
    import tilelang

    check_skinny_config(config, n, k, arch)
    target_arch = hopper.WGMMA_ARCH if arch == "sm_90" else arch
    return tilelang.compile(build_skinny_kernel(n, k, config), target={"kind": "cuda", "arch": target_arch}, pass_configs=example.PASS_CONFIGS)


# ----------------------------------------------------------------------------------------------
# 3. The launcher
# ----------------------------------------------------------------------------------------------

_KERNELS: dict = {}


def launch_skinny(x: torch.Tensor, w: example.NVFP4W4A16Weight, config: SkinnyConfig, out: torch.Tensor) -> None:
    """One launch on checked inputs (at most ``config.block_x`` rows)."""
    if x.shape[0] > config.block_x:
        raise ValueError(f"config {config}: block_x={config.block_x} holds fewer rows than x's {x.shape[0]}")
    key = (w.n, w.k, config, w.device.index)
    kernel = _KERNELS.get(key)
    if kernel is None:  # compiling inside a CUDA-graph capture works (see the example)
        kernel = _KERNELS[key] = compile_skinny(w.n, w.k, config, example.device_arch(w.device))
    split_n = config.tail_tiles * w.n // config.columns(w.n)  # the tail's weight rows (0: all split)
    partials, tickets = example.split_k_buffers(x, w, config.split_plan, split_n)
    kernel(x, w.codes, w.scales, w.alpha_x128, out, partials, tickets)
