"""Hopper path (sm_90a only): NVFP4 W4A16 GEMM on wgmma, with the dequantized weights as the register
operand.

wgmma takes A from registers and B from shared memory, so this kernel computes ``y^T = W x^T``: the
weights are A, dequantized in registers exactly as in the example (same prepared layout, same
``nvfp4_dequant_block``), and the x tile is B. The example's 32x32 block gives a lane the rows
n = 8j + g of its warp's block and, per k16 step, the B registers ``b[4j + 2s + h]``; the m16n8k16 A
fragment of 16 rows (and wgmma's per-warp A fragment, which is the same) is a permutation of those:
rows 16p + {g, g+8} of the block are ``[b[4(2p)+2s], b[4(2p+1)+2s], b[4(2p)+2s+1], b[4(2p+1)+2s+1]]``.
One warpgroup covers 128 weight rows (warp w: block w) as two m64 atoms; atom p's row
``16w + 8rh + g`` is weight row ``32w + 16p + 8rh + g``, which the epilogue maps back.
"""

import pathlib
import sys
from typing import NamedTuple, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples" / "gemm_sm120"))

import sm120_nvfp4_w4a16_gemm as example  # noqa: E402

WARPGROUP_ROWS = 128  # weight rows per CTA: 4 warps x one 32-row fragment block
WGMMA_ATOM_M = 64
SWIZZLE_K = 64  # bf16 values per 128-byte swizzled row of the x tile, the wgmma B operand
WGMMA_ARCH = "sm_90a"  # wgmma needs the arch-specific target


class WgmmaConfig(NamedTuple):
    """``block_x`` rows of x per CTA (the wgmma N, a multiple of 16, at most 128 so the accumulators
    fit), ``block_k`` = 64 (one 128-byte swizzled row), ``stages`` cp.async stages, ``split_k`` CTAs
    per output tile (grid.y), reduced as in the example."""

    block_x: int = 64
    block_k: int = SWIZZLE_K
    stages: int = 3
    split_k: int = 1

    def kernel_shape(self) -> example.KernelShape:
        """The example's shape view (its checks: divisibility, shared memory, accumulators, split)."""
        return example.KernelShape(self.block_x, WARPGROUP_ROWS, self.block_k, 1, 4, self.stages, self.split_k)


DEFAULT_STAGES = 3  # measured ahead of 4 in most H200 cells (2026-11-29)
HEURISTIC_MIN_M = 64  # from here on it beat the fragment and tile kernels in every H200 cell measured
FULL_WAVE_BLOCK_X = 128  # the larger x block, once it still gives every SM a CTA


def get_wgmma_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Optional["WgmmaConfig"]:
    """The sm_90 heuristic for shapes without a tuned entry: None below HEURISTIC_MIN_M rows; 64-row x
    blocks, or 128 where that still makes a full wave (H200, 2026-11-29: 16384x5120 M = 256 70 us
    against 95 us; on 5120x6144 the 64-row block stayed ahead); split-K, as in the example's
    heuristic, where the tiles would leave half of the SMs idle (N = 5120 gives 40 tiles per x block)."""
    if m < HEURISTIC_MIN_M:
        return None
    wide = m > 2 * WGMMA_ATOM_M and n // WARPGROUP_ROWS * -(-m // FULL_WAVE_BLOCK_X) >= sm_count
    block_x = FULL_WAVE_BLOCK_X if wide else 64
    tiles = n // WARPGROUP_ROWS * -(-m // block_x)
    split = example._split_k(tiles, m, n, k, SWIZZLE_K, DEFAULT_STAGES, 2 * sm_count, sm_count)
    return WgmmaConfig(block_x, SWIZZLE_K, DEFAULT_STAGES, split)


def check_wgmma_config(config: WgmmaConfig, n: int, k: int, config_types=(WgmmaConfig,)) -> None:
    example.check_config(config, n, k, config_types)
    if config.block_k != SWIZZLE_K:
        raise ValueError(f"config {config}: block_k must be {SWIZZLE_K} (one 128-byte swizzled row)")


# An empty function whose only job is the buffer read its caller's access_ptr declares (see below).
TILE_READ_MARKER_SOURCE = "__device__ __forceinline__ void nvfp4_tile_read(const void*) {}\n"


def build_wgmma_kernel(n: int, k: int, config: WgmmaConfig):
    import tilelang.language as T
    from tilelang.cuda.intrinsics.macro.wgmma_macro_generator import TensorCoreIntrinEmitter
    from tilelang.layout import make_full_bank_swizzled_layout

    bx, bk, rows, split_k = config.block_x, config.block_k, WARPGROUP_ROWS, config.split_k
    k_tiles = k // split_k // bk
    atoms = rows // WGMMA_ATOM_M
    k16_steps = bk // 16
    a_size = k16_steps * atoms * 8  # bf16 per thread: [k16 step][m64 atom][4 registers]
    acc_size = atoms * bx // 2  # per atom: bx / 8 column groups x 4 floats
    exchange = example.split_k_exchange(n, split_k, acc_size)
    M = T.dynamic("m")

    def set_b_layout(emitter, layout) -> None:
        emitter._assign_b_shared_layout(layout)

    ops = example.operands(n, k, M)

    # Accumulator q = (p * bx / 8 + i) * 4 + c holds atom row 16w + 8(c // 2) + g, i.e. weight row
    # 32w + 16p + 8(c // 2) + g, and x row 8i + 2t + c % 2 (the wgmma D-fragment layout).
    def x_row(q, bm, lane):
        return bm * bx + q % (bx // 2) // 4 * 8 + lane % 4 * 2 + q % 2

    def w_row(q, bn, lane, warp):
        return bn * rows + warp * 32 + q // (bx // 2) * 16 + q % 4 // 2 * 8 + lane // 4

    store = example.scaled_store(acc_size)

    @T.macro
    def store_output(acc, y, alpha_x128, bm, bn, lane, warp, m):
        store(acc, lambda q: x_row(q, bm, lane), lambda q: w_row(q, bn, lane, warp), y, alpha_x128, m)

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
        with T.Kernel(n // rows, split_k, T.ceildiv(M, bx), threads=128) as (bn, bk_index, bm):
            x_tile = T.alloc_shared((bx, bk), T.bfloat16)
            code_tile = T.alloc_shared((rows // example.FRAG_N, bk // example.FRAG_K, example.WORDS_PER_BLOCK), T.int32)
            scale_tile = T.alloc_shared((rows // example.FRAG_N, bk // example.FRAG_K, example.SCALE_WORDS_PER_BLOCK), T.int32)
            a_regs = T.alloc_local((a_size,), T.bfloat16)
            b_regs = T.alloc_local((32,), T.bfloat16)
            acc = T.alloc_local((acc_size,), T.float32)
            T.import_source(example.DEQUANT_SOURCE + TILE_READ_MARKER_SOURCE)
            x_layout = make_full_bank_swizzled_layout(x_tile)
            T.annotate_layout({x_tile: x_layout})
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            wgmma = TensorCoreIntrinEmitter(
                a_dtype=T.bfloat16, b_dtype=T.bfloat16, accum_dtype=T.float32,
                a_transposed=False, b_transposed=True,
                block_row_warps=4, block_col_warps=1, warp_row_tiles=rows // 4, warp_col_tiles=bx,
                chunk=bk, thread_var=tx,
            )  # fmt: skip
            set_b_layout(wgmma, x_layout)  # the B descriptor follows the x tile's swizzle
            for i in T.unroll(acc_size):
                acc[i] = 0.0
            for ko in T.Pipelined(k_tiles, num_stages=config.stages):
                kt = bk_index * k_tiles + ko
                T.copy(x[bm * bx, kt * bk], x_tile)
                T.copy(codes[bn * (rows // example.FRAG_N), kt * (bk // example.FRAG_K), 0], code_tile)
                T.copy(scales[bn * (rows // example.FRAG_N), kt * (bk // example.FRAG_K), 0], scale_tile)
                for kb in T.unroll(bk // example.FRAG_K):
                    T.call_extern(
                        "handle",
                        "nvfp4_dequant_block",
                        T.address_of(code_tile[warp, kb, lane * 4]),
                        T.address_of(scale_tile[warp, kb, lane // 4 * 2]),
                        T.address_of(b_regs[0]),
                    )
                    # A register (h, rowhalf) of (k16 step s, m64 atom p) is B register 4(2p + rowhalf) + 2s + h;
                    # q walks this k32 block's A values in register order: q = ((s * atoms + p) * 4 + h * 2 + rh) * 2 + e.
                    for q in T.unroll(2 * atoms * 8):
                        a_regs[kb * 2 * atoms * 8 + q] = b_regs[(4 * (2 * (q // 8 % atoms) + q // 2 % 2) + 2 * (q // (8 * atoms)) + q // 4 % 2) * 2 + q % 2]
                wgmma.wgmma_rs(a_regs[0:a_size], x_tile[0:bx, 0:bk], acc[0:acc_size])
                # The wgmma reads x_tile through a descriptor, which T.Pipelined does not see as a read:
                # without this marker it issues the next copy into this stage before the wgmma runs.
                T.call_extern("handle", "nvfp4_tile_read", T.access_ptr(x_tile[0, 0], "r", extent=bx * bk))
            if split_k == 1:
                store_output(acc, y, alpha_x128, bm, bn, lane, warp, M)
            else:
                ticket = T.alloc_shared((1,), T.int32)
                exchange(
                    acc, lambda q: x_row(q, bm, lane), lambda q: w_row(q, bn, lane, warp),
                    partials, tickets, ticket, bm * (n // rows) + bn, bk_index, M, tx, True,
                )  # fmt: skip
                if ticket[0] == split_k - 1:
                    store_output(acc, y, alpha_x128, bm, bn, lane, warp, M)

    return nvfp4_w4a16_wgmma


# TileLang's wgmma descriptor macro binds its base pointer as a let: inline lets, or nvcc sees an
# undefined `B_base_ptr` (TileLang 0.1.15). Warp specialization stays off as in the example.
WGMMA_PASS_CONFIGS = {**example.PASS_CONFIGS, "tl.force_let_inline": True}


def compile_wgmma(n: int, k: int, config: WgmmaConfig):
    """Lower and compile for sm_90a; needs nvcc, not a GPU."""
    import tilelang

    check_wgmma_config(config, n, k)
    return tilelang.compile(
        build_wgmma_kernel(n, k, config), target={"kind": "cuda", "arch": WGMMA_ARCH}, pass_configs=WGMMA_PASS_CONFIGS
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
    partials, tickets = example.split_k_buffers(x, w, config.split_k)
    _KERNELS[key](x, w.codes, w.scales, w.alpha_x128, out, partials, tickets)
