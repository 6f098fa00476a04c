"""NVFP4 W4A16 GEMM for LLM decoding, in TileLang: ``y = x @ W^T * alpha``.

``x`` is BF16 ``[M, K]`` (M = 1..1024 per launch; larger M runs in 1024-row chunks), ``W`` is an
NVFP4 checkpoint weight (packed E2M1 codes, one E4M3 scale per 16 values along K, a global
multiplier ``alpha``), ``y`` is BF16 ``[M, N]`` accumulated in FP32.

The weights stay 4-bit in memory. They are dequantized in registers, straight into the B fragments
of ``mma.sync.m16n8k16``; no BF16 weight tile is ever written to shared memory. One kernel source
serves sm_90 (H100/H200) and sm_120 (RTX PRO 6000 Blackwell, RTX 5090).

The module reads top to bottom:

1. the checkpoint format and the FP32 reference (the project's own decoders);
2. the prepared layout: 32x32 blocks in fragment order, bit-scattered codes, re-encoded scales,
   and a CPU emulation of the register dequant that checks the layout bit for bit;
3. the kernel: the dequant helper (inline PTX) and one parametrized ``T.Pipelined`` kernel with a
   deterministic split-K reduction;
4. configs and the heuristic (``FragConfig``, ``TileConfig``, ``get_config``);
5. the public function ``nvfp4_w4a16_linear``;
6. the command line: ``--verify``, ``--bench``, and a compile-only mode for machines without a GPU.
"""


import argparse
import dataclasses
import math
import sys
from typing import NamedTuple, Union

import torch

# ----------------------------------------------------------------------------------------------
# 1. The checkpoint format and the FP32 reference
# ----------------------------------------------------------------------------------------------

# E2M1 code -> value. Codes 8..15 are the same magnitudes negated (8 is -0).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALE_BLOCK = 16  # one E4M3 scale per 16 consecutive K values
WEIGHT_BYTES_PER_CODE = 9 / 16  # half a byte of code plus a sixteenth of a scale byte
E4M3_MAX = 448.0  # largest finite E4M3 value
E4M3_NAN_MAGNITUDE = 0x7F  # 0x7F and 0xFF are NaN in E4M3 (there is no infinity)


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 ``[N, K/2]`` (uint8 or int8) -> float32 ``[N, K]``.

    Byte ``j`` of a row holds k = 2j in its low nibble and k = 2j+1 in its high nibble.
    """
    codes = _unpack_codes(packed).long()
    magnitude = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)[codes & 7]
    return torch.where(codes >= 8, -magnitude, magnitude)


def decode_e4m3(raw: torch.Tensor) -> torch.Tensor:
    """E4M3 bit patterns (uint8) -> float32: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits,
    subnormals ``m * 2^-9`` when the exponent field is 0, NaN for 0x7F and 0xFF."""
    b = raw.to(torch.int32)
    exponent, mantissa = (b >> 3) & 0xF, (b & 7).float()
    normal = (1.0 + mantissa / 8.0) * torch.exp2((exponent - 7).float())
    subnormal = mantissa * 2.0**-9
    magnitude = torch.where(exponent == 0, subnormal, normal)
    magnitude = torch.where((b & 0x7F) == E4M3_NAN_MAGNITUDE, torch.nan, magnitude)
    return torch.where((b & 0x80) != 0, -magnitude, magnitude)


def decode_ue4m3(raw: torch.Tensor) -> torch.Tensor:
    """Unsigned E4M3 bytes (uint8, sign bit always 0) -> float32; a byte with bit 7 set is NaN."""
    return torch.where(raw.to(torch.int32) >= 0x80, torch.nan, decode_e4m3(raw))


def decode_scales(scales: torch.Tensor) -> torch.Tensor:
    """Block scales as stored in a checkpoint (float8_e4m3fn or UE4M3 bytes) -> float32."""
    if scales.dtype == torch.float8_e4m3fn:
        return decode_e4m3(scales.view(torch.uint8))
    return decode_ue4m3(scales)


def dequantize_nvfp4(packed: torch.Tensor, scales: torch.Tensor, alpha) -> torch.Tensor:
    """``W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * alpha[n]`` in float32."""
    w = decode_e2m1(packed) * decode_scales(scales).repeat_interleave(SCALE_BLOCK, dim=1)
    alpha = torch.as_tensor(alpha, dtype=torch.float32, device=w.device).reshape(-1, 1)
    return w * alpha


def reference_nvfp4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, alpha) -> torch.Tensor:
    """The FP32 reference every GPU check compares against."""
    return x.float() @ dequantize_nvfp4(packed, scales, alpha).to(x.device).T


def _unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).to(torch.int32)
    return torch.stack((b & 0xF, b >> 4), dim=-1).reshape(packed.shape[0], -1)


# ----------------------------------------------------------------------------------------------
# 2. The prepared layout
# ----------------------------------------------------------------------------------------------
#
# The weight is cut into blocks of 32 (n) x 32 (k) codes, 512 bytes each, ordered like the B
# fragments of one warp: lane l owns 16 consecutive bytes (four 32-bit words), so one 16-byte
# shared-memory load per lane yields the B fragments of four n8 tiles x two k16 steps.
# Word j of lane l (group g = l // 4, thread t = l % 4) feeds n = 8j + g. Each word feeds four
# bf16x2 registers r = 2s + h (s: k16 step, h: first or second B register of that step), whose
# low and high halves hold k = 16s + 8h + 2t and k + 1. These are the PTX m16n8k16 B-fragment
# positions (``b0,b1`` at k = 2t, 2t+1 and ``b2,b3`` at k = 2t+8, 2t+9, column n = g).
#
# Inside a word the 8 codes are bit-scattered so that a BF16 register comes out of a mask:
# a code lands with its sign at bit 15 and its 3 exponent-mantissa bits ``eem`` at bits 8:6 of a
# BF16 half. That half is then exactly ``e2m1 * 2^-126`` (a BF16 subnormal when e = 0).
FRAG_N = 32
FRAG_K = 32
WORDS_PER_BLOCK = FRAG_N * FRAG_K // 8  # 8 codes per 32-bit word
SCALE_WORDS_PER_BLOCK = FRAG_N * (FRAG_K // SCALE_BLOCK) // 4  # 4 scale bytes per word
CODE_FIELD_MASK = 0x81C081C0  # sign (bit 15) and eem (bits 8:6) of both BF16 halves
# How each of a word's four registers is cut out of it: OR of (left rotation, mask) parts. No four
# rotations place every word bit in a field (an exhaustive search says five are needed), so three
# registers take one rotation and one AND, and the fourth takes the eem bits 8 of both halves from a
# fifth rotation: 9 integer ops per word. Rotations whose wrapped bits the mask drops compile to
# plain left shifts, which ptxas issues as IMAD.SHL on the FMA pipe instead of the busier ALU pipe
# (the kernel's M = 1 time grows with its instruction count; with the scale pairs below this layout
# took the SASS of the M = 1 loop from 427 to 361 instructions per warp and 128-deep k tile).
REGISTER_PARTS = (
    ((0, CODE_FIELD_MASK),),
    ((4, CODE_FIELD_MASK),),
    ((10, CODE_FIELD_MASK),),
    ((6, CODE_FIELD_MASK & ~0x01000100), (14, 0x01000100)),
)


def _code_bit_positions() -> list[list[int]]:
    """Word bit position of each code bit (m, e0, e1, sign) for the 8 codes of a word, in the order
    (register r, half). Derived from REGISTER_PARTS, so the packer and the dequant agree."""
    half_targets = (6, 7, 8, 15)  # BF16 bits that receive m, e0, e1, sign
    positions = []
    for parts in REGISTER_PARTS:
        for half in range(2):
            slot = []
            for target in half_targets:
                target += 16 * half
                (rotation,) = [rotation for rotation, mask in parts if mask >> target & 1]
                slot.append((target - rotation) % 32)
            positions.append(slot)
    assert sorted(sum(positions, [])) == list(range(32)), "every word bit carries one code bit"
    return positions


CODE_BIT_POSITIONS = _code_bit_positions()


def _scale_byte_table() -> torch.Tensor:
    """E4M3 magnitude byte -> byte ``b`` with ``bf16(0x7000 | b << 4) == scale * 2^119``.

    The 5 high bits of ``b`` extend the BF16 exponent field (224 + (b >> 3) - 127 = 97 + (b >> 3)),
    the 3 low bits become the top mantissa bits. Exact for every finite E4M3 value, subnormals
    included (exponents -9..8 land on b >> 3 = 13..30). Zero and NaN get 0; their codes are zeroed
    or rejected at preparation.
    """
    table = torch.zeros(128, dtype=torch.uint8)
    for raw in range(1, E4M3_NAN_MAGNITUDE):
        value = float(decode_e4m3(torch.tensor([raw], dtype=torch.uint8))[0])
        mantissa, exponent = math.frexp(value)  # value = mantissa * 2^exponent, 0.5 <= mantissa < 1
        exponent -= 1
        fraction = mantissa * 2 - 1
        b = ((exponent + 22) << 3) | int(fraction * 8)
        assert fraction * 8 == int(fraction * 8) and 13 <= (b >> 3) <= 30
        table[raw] = b
    return table


SCALE_BYTE_TABLE = _scale_byte_table()
# A lane's scale word holds the bytes of two of its words j (k16 steps 0 and 1 each, see
# _arrange_scales), so one PRMT (bytes j % 2 and 2 + j % 2 into the two halves) and one LEA
# (``* 16 + SCALE_BIAS_WORD``) give word j's BF16 pair ``scale * 2^119``, step 0 in the low half and
# step 1 in the high half. The multiplies read one half of it (``.H0_H0`` / ``.H1_H1``, free).
SCALE_PAIR_PICK = 0x4240  # PRMT selector: bytes 0 and 2 into bytes 0 and 2, zeros above; + 0x101 picks 1 and 3
SCALE_BIAS_WORD = 0x70007000
# code * 2^-126 times scale * 2^119 is ``fp4 * scale * 2^-7``; the epilogue multiplies by 2^7.
DEQUANT_EXPONENT_OFFSET = 7

SM120_SMEM_PER_CTA = 99 * 1024
SM120_SMEM_PER_SM = 100 * 1024
MAX_M_PER_LAUNCH = 1024
PREPARE_ROWS_PER_CHUNK = 2048  # rows re-laid out at a time: ~0.2 GB of temporaries at K = 5120
# Offsets in the kernels are 32-bit: each operand must stay under 2^31 elements (4 GiB of x).
MAX_OPERAND_BYTES = 4 * 1024**3


@dataclasses.dataclass(frozen=True)
class NVFP4W4A16Weight:
    """A weight prepared by :func:`prepare_nvfp4_weight`, the same size as the checkpoint tensors.

    ``codes``: int32 ``[N/32, K/32, 128]`` (512-byte fragment-ordered blocks);
    ``scales``: int32 ``[N/32, K/32, 16]`` (re-encoded scale bytes, 64 per block);
    ``alpha_x128``: float32 ``[N]``, the per-column multiplier times 2^7.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    alpha_x128: torch.Tensor
    n: int
    k: int

    @property
    def device(self) -> torch.device:
        return self.codes.device


def prepare_nvfp4_weight(
    packed: torch.Tensor, scales: torch.Tensor, alpha: Union[float, torch.Tensor]
) -> NVFP4W4A16Weight:
    """Re-lay out an NVFP4 checkpoint weight once, on its device, for :func:`nvfp4_w4a16_linear`.

    Args:
        packed: uint8/int8 ``[N, K/2]`` packed E2M1 codes (low nibble first).
        scales: ``[N, K/16]`` block scales, ``torch.float8_e4m3fn`` or uint8 UE4M3 bytes.
        alpha: the global multiplier (ModelOpt's ``weight_scale_2``; for compressed-tensors pass
            ``1 / weight_global_scale``): a float, a float32 tensor with one element, or float32 ``[N]``.

    Zero scales zero their codes and negative scales flip the code signs here, so the kernel never
    sees a sign or a zero in a scale. NaN scales are rejected. On a CUDA device this also creates
    the per-device split-K workspace (never lazily inside a CUDA-graph capture).
    """
    n, k, alpha = _check_prepare_inputs(packed, scales, alpha)
    device = packed.device
    magnitude, negative = _scale_magnitudes(scales)
    codes = torch.empty((n // FRAG_N, k // FRAG_K, WORDS_PER_BLOCK), dtype=torch.int32, device=device)
    for r0 in range(0, n, PREPARE_ROWS_PER_CHUNK):  # bounded temporaries (int64 words) for big weights
        rows = slice(r0, min(n, r0 + PREPARE_ROWS_PER_CHUNK))
        chunk = _unpack_codes(packed[rows])
        chunk = torch.where(torch.repeat_interleave(magnitude[rows], SCALE_BLOCK, dim=1) == 0, 0, chunk)
        chunk = chunk ^ (torch.repeat_interleave(negative[rows], SCALE_BLOCK, dim=1).to(torch.int32) << 3)
        codes[r0 // FRAG_N : rows.stop // FRAG_N] = _scatter_codes(chunk, rows.stop - r0, k)
    prepared = NVFP4W4A16Weight(
        codes=codes,
        scales=_arrange_scales(SCALE_BYTE_TABLE.to(device)[magnitude.long()], n, k),
        alpha_x128=(alpha * 2.0**DEQUANT_EXPONENT_OFFSET).expand(n).contiguous(),
        n=n,
        k=k,
    )
    if device.type == "cuda":
        _ensure_workspace(device, tickets=_tickets_needed(n))
    return prepared


def _scale_magnitudes(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raw = scales.view(torch.uint8).to(torch.int32)
    return raw & 0x7F, (raw & 0x80) != 0


def _scatter_codes(codes: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``[N, K]`` codes -> int32 ``[N/32, K/32, 128]`` fragment-ordered, bit-scattered words."""
    # n = 32 nb + 8 j + g, k = 32 kb + 16 s + 8 h + 2 t + half  ->  [nb, kb, g, t, j, (s, h, half)]
    c = codes.reshape(n // FRAG_N, 4, 8, k // FRAG_K, 2, 2, 4, 2)
    c = c.permute(0, 3, 2, 6, 1, 4, 5, 7).reshape(-1, 8).to(torch.int64)
    word = torch.zeros(c.shape[0], dtype=torch.int64, device=c.device)
    for slot, positions in enumerate(CODE_BIT_POSITIONS):
        for bit, position in enumerate(positions):
            word |= ((c[:, slot] >> bit) & 1) << position
    return _as_int32_words(word).reshape(n // FRAG_N, k // FRAG_K, WORDS_PER_BLOCK)


def _arrange_scales(scale_bytes: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """``[N, K/16]`` scale bytes -> int32 ``[N/32, K/32, 16]``: word ``2g + q`` of a block holds in
    byte ``2s + (j % 2)`` the scale of n = 8j + g, k16 step s, for j = 2q, 2q + 1 (lanes 4g..4g+3
    read words 2g and 2g+1)."""
    s = scale_bytes.to(torch.uint8).reshape(n // FRAG_N, 2, 2, 8, k // FRAG_K, 2)  # [nb, q, j%2, g, kb, s]
    s = s.permute(0, 4, 3, 1, 5, 2).reshape(n // FRAG_N, k // FRAG_K, SCALE_WORDS_PER_BLOCK * 4)
    return s.contiguous().view(torch.int32).reshape(n // FRAG_N, k // FRAG_K, SCALE_WORDS_PER_BLOCK)


def _as_int32_words(word: torch.Tensor) -> torch.Tensor:
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def emulate_register_dequant(w: NVFP4W4A16Weight) -> torch.Tensor:
    """Bit-exact CPU emulation of what the kernel's dequant helper puts in the B-fragment registers,
    placed at the PTX m16n8k16 B-fragment positions and scaled by ``alpha * 2^7``: float32 ``[N, K]``.

    It runs the same masks, shifts, byte permutes and BF16 multiply as the CUDA helper, so a
    prepared weight whose emulation equals :func:`dequantize_nvfp4` is dequantized exactly on the GPU.
    """
    words = w.codes.cpu().to(torch.int64) & 0xFFFFFFFF  # [nb, kb, 128]
    words = words.reshape(*words.shape[:2], 32, 4)  # [nb, kb, lane, j]
    scale_words = w.scales.cpu().to(torch.int64) & 0xFFFFFFFF
    scale_words = scale_words.reshape(*scale_words.shape[:2], 8, 2)  # [nb, kb, g, q]
    registers = [sum(_rotate_left(words, rotation) & mask for rotation, mask in parts) for parts in REGISTER_PARTS]
    bits = torch.stack(registers, dim=-1)  # [nb, kb, lane, j, r]
    halves = torch.stack((bits & 0xFFFF, bits >> 16), dim=-1)  # [nb, kb, lane, j, r, half]
    codes_bf16 = _bf16_bits_to_float(halves)
    # Register r of word j: the half r // 2 (k16 step) of word j's pair, built as the kernel does.
    lane_group = torch.arange(32) // 4
    scale_word = scale_words[:, :, lane_group].repeat_interleave(2, dim=-1)  # [nb, kb, lane, j]
    picked = (scale_word >> (8 * (torch.arange(4) % 2))) & 0x00FF00FF  # what the PRMT selects
    pair = (picked * 16 + SCALE_BIAS_WORD) & 0xFFFFFFFF
    halves_of_pair = torch.stack((pair & 0xFFFF, pair >> 16), dim=-1)  # [nb, kb, lane, j, s]
    scale_bf16 = _bf16_bits_to_float(halves_of_pair).repeat_interleave(2, dim=-1)  # [nb, kb, lane, j, r]
    product = (codes_bf16.double() * scale_bf16[..., None].double()).float()
    assert torch.equal(product.to(torch.bfloat16).float(), product), "mul.rn.bf16x2 would round"
    # Place register (lane, j, r, half) at n = 8j + g, k = 16 (r // 2) + 8 (r % 2) + 2t + half.
    nb, kb = words.shape[:2]
    p = product.reshape(nb, kb, 8, 4, 4, 2, 2, 2)  # [nb, kb, g, t, j, s, h, half]
    p = p.permute(0, 4, 2, 1, 5, 6, 3, 7).reshape(w.n, w.k)
    return p * w.alpha_x128.cpu().reshape(-1, 1)


def _rotate_left(t: torch.Tensor, amount: int) -> torch.Tensor:
    return ((t << amount) | (t >> (32 - amount) % 32)) & 0xFFFFFFFF


def _bf16_bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    return (bits.to(torch.int32) << 16).view(torch.float32)


# ----------------------------------------------------------------------------------------------
# 3. The kernel
# ----------------------------------------------------------------------------------------------

# The register dequant, in CUDA. One call turns a lane's 16-byte block slice and its 8 scale
# bytes into the 16 bf16x2 B registers of two n16 tiles x two k16 steps. Per word: 9 integer ops cut
# out its four registers (REGISTER_PARTS), one PRMT and one LEA build its scale pair, and one
# mul.rn.bf16x2 per register applies one half of the pair (exact: the product has at most 6
# significant bits). mul.rn.bf16x2 needs sm_90 or newer.
def _rotation(rotation: int, mask: int) -> str:
    if mask & ((1 << rotation) - 1) == 0:  # the wrapped bits are masked off: a plain shift
        return f"(x << {rotation})" if rotation else "x"
    return f"__funnelshift_l(x, x, {rotation})"


def _register_expression(parts) -> str:
    return " | ".join(f"({_rotation(rotation, mask)} & 0x{mask:08X}u)" for rotation, mask in parts)


_REGISTER_LINES = "\n".join(
    f"    b[4 * j + {r}] = nvfp4_mul_bf16x2_{'lo' if r < 2 else 'hi'}({_register_expression(parts)}, pair);"
    for r, parts in enumerate(REGISTER_PARTS)
)


def _mul_by_half(half: str) -> str:
    """``a * {h, h}`` for half ``h`` of ``pair``; ptxas folds the broadcast into the multiply."""
    return f"""
__device__ __forceinline__ unsigned nvfp4_mul_bf16x2_{half}(unsigned a, unsigned pair) {{
  unsigned d;
  asm("{{ .reg .b16 lo, hi; .reg .b32 h2; mov.b32 {{lo, hi}}, %2; mov.b32 h2, {{{half}, {half}}};"
      " mul.rn.bf16x2 %0, %1, h2; }}" : "=r"(d) : "r"(a), "r"(pair));
  return d;
}}
"""


def _scale_pair(scale_word: str, odd: str) -> str:
    """The CUDA expression of word j's scale pair from its scale word (``odd``: j % 2)."""
    return f"__byte_perm({scale_word}, 0, 0x{SCALE_PAIR_PICK:04X}u + ({odd}) * 0x101u) * 16u + 0x{SCALE_BIAS_WORD:08X}u"


def dequant_function(name: str, words: int, pairs: bool = False) -> str:
    """The dequant of ``words`` consecutive words of a lane's block slice (4: the whole slice; 2: the
    half for n = 8j + g with j in {2p, 2p + 1}, given pointers advanced by p words and p scale words).
    ``pairs``: the second pointer holds the words' scale pairs, made beforehand (``SCALE_PAIRS_SOURCE``),
    one per word, instead of their scale words."""
    code_type, scale_type = {4: ("uint4", "uint2"), 2: ("uint2", "unsigned")}[words]
    code_fields = ", ".join(f"w.{c}" for c in "xyzw"[:words])
    scale_fields = "s.x, s.y" if words == 4 else "s"
    if pairs:
        scales = f"""  const {code_type} s = *reinterpret_cast<const {code_type}*>(scales);
  const unsigned pairs[{words}] = {{{code_fields.replace("w.", "s.")}}};"""
        pair = "pairs[j]"
    else:
        scales = f"""  const {scale_type} s = *reinterpret_cast<const {scale_type}*>(scales);
  const unsigned scale_words[{words // 2}] = {{{scale_fields}}};"""
        pair = _scale_pair("scale_words[j / 2]", "j & 1")
    return f"""
__device__ __forceinline__ void {name}(const void* codes, const void* scales, void* frag) {{
  const {code_type} w = *reinterpret_cast<const {code_type}*>(codes);
{scales}
  unsigned* b = reinterpret_cast<unsigned*>(frag);
  const unsigned words[{words}] = {{{code_fields}}};
#pragma unroll
  for (int j = 0; j < {words}; ++j) {{
    const unsigned pair = {pair};
    const unsigned x = words[j];
{_REGISTER_LINES}
  }}
}}
"""


# The two scale pairs of one scale word (its words j = 2p and 2p + 1), for kernels that make them
# once per stage instead of once per lane (four lanes share a scale word).
SCALE_PAIRS_SOURCE = f"""
__device__ __forceinline__ void nvfp4_scale_pairs(const void* scale_word, void* pairs) {{
  const unsigned s = *reinterpret_cast<const unsigned*>(scale_word);
  *reinterpret_cast<uint2*>(pairs) = make_uint2({_scale_pair("s", "0")}, {_scale_pair("s", "1")});
}}
"""


DEQUANT_SOURCE = _mul_by_half("lo") + _mul_by_half("hi") + dequant_function("nvfp4_dequant_block", 4)

# The split-K and stream-K partials move four FP32 accumulators per 16-byte access, through L2 only
# (__stcg, __ldcg): another SM wrote what a reducing CTA reads, so its L1 must not answer.
PARTIALS_SOURCE = """
__device__ __forceinline__ void nvfp4_store_partials4(float* dst, const float* acc) {
  __stcg(reinterpret_cast<float4*>(dst), make_float4(acc[0], acc[1], acc[2], acc[3]));
}
__device__ __forceinline__ void nvfp4_load_partials4(float* acc, const float* src) {
  const float4 v = __ldcg(reinterpret_cast<const float4*>(src));
  acc[0] = v.x; acc[1] = v.y; acc[2] = v.z; acc[3] = v.w;
}
__device__ __forceinline__ void nvfp4_add_partials4(float* acc, const float* src) {
  const float4 v = __ldcg(reinterpret_cast<const float4*>(src));
  acc[0] += v.x; acc[1] += v.y; acc[2] += v.z; acc[3] += v.w;
}

// The marked exchange (``split_k_exchange``): V quadruples of accumulators per thread, `stride`
// floats apart in a slot, slots `slot_stride` floats apart. Relaxed GPU-scope accesses: the reducer
// sees a writer's value once it lands in L2, and no L1 answers for it.
#define NVFP4_PARTIAL_MARK 0xFFFFFFFFu
__device__ __forceinline__ uint4 nvfp4_load_marked4(const float* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void nvfp4_store_marked4(float* p, uint4 v) {
  asm volatile("st.relaxed.gpu.global.v4.b32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ unsigned nvfp4_unmarked(float f) {  // a NaN with the mark's bits goes as the canonical one
  const unsigned u = __float_as_uint(f);
  return u == NVFP4_PARTIAL_MARK ? 0x7FFFFFFFu : u;
}
__device__ __forceinline__ bool nvfp4_marked(uint4 v) {
  return v.x == NVFP4_PARTIAL_MARK || v.y == NVFP4_PARTIAL_MARK || v.z == NVFP4_PARTIAL_MARK || v.w == NVFP4_PARTIAL_MARK;
}
// A writer: its piece into its slot.
template <int V>
__device__ __forceinline__ void nvfp4_post_partials(float* slot, const float* acc, int stride) {
#pragma unroll
  for (int j = 0; j < V; ++j)
    nvfp4_store_marked4(slot + j * stride, make_uint4(nvfp4_unmarked(acc[4 * j]), nvfp4_unmarked(acc[4 * j + 1]),
                                                      nvfp4_unmarked(acc[4 * j + 2]), nvfp4_unmarked(acc[4 * j + 3])));
}
// The reducer, the tile's last split: every piece of the S slots before its own loaded at once, those
// still marked loaded again until none is, the sum in split order (the ticket exchange's), and the
// marks put back for the next launch.
template <int V, int S>
__device__ __forceinline__ void nvfp4_take_partials(float* acc, float* slot0, int stride, int slot_stride) {
  uint4 v[S][V];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int j = 0; j < V; ++j) v[s][j] = nvfp4_load_marked4(slot0 + s * slot_stride + j * stride);
  bool waiting;
  do {
    waiting = false;
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
      for (int j = 0; j < V; ++j)
        if (nvfp4_marked(v[s][j])) {
          v[s][j] = nvfp4_load_marked4(slot0 + s * slot_stride + j * stride);
          waiting = true;
        }
  } while (waiting);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      sum.x += __uint_as_float(v[s][j].x); sum.y += __uint_as_float(v[s][j].y);
      sum.z += __uint_as_float(v[s][j].z); sum.w += __uint_as_float(v[s][j].w);
    }
    acc[4 * j] = sum.x + acc[4 * j]; acc[4 * j + 1] = sum.y + acc[4 * j + 1];
    acc[4 * j + 2] = sum.z + acc[4 * j + 2]; acc[4 * j + 3] = sum.w + acc[4 * j + 3];
  }
  const uint4 mark = make_uint4(NVFP4_PARTIAL_MARK, NVFP4_PARTIAL_MARK, NVFP4_PARTIAL_MARK, NVFP4_PARTIAL_MARK);
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int j = 0; j < V; ++j) nvfp4_store_marked4(slot0 + s * slot_stride + j * stride, mark);
}
"""
PARTIAL_MARK = 0xFFFFFFFF  # NVFP4_PARTIAL_MARK, a NaN: what every word of the marked partials holds between launches
DEVICE_SOURCE = DEQUANT_SOURCE + PARTIALS_SOURCE  # what every kernel of this family imports


# The output tile leaves through shared memory. Stored straight from the accumulators, a warp writes
# 2-byte values over eight rows (the m16n8 C-fragment layout: four lanes per row, two columns each);
# staged, a thread stores 16 bytes of one row and a warp whole 128-byte lines. H200, 2026-11-30s
# (TileConfig(64, 256, 64, 1, 4) and (128, 128, 64, 2, 2) at N = 16384, M = 256, K = 1024): the stores
# from the accumulators took 7-10 us of a 33-37 us call (results/h200_timings_2026-11-30s_example_
# epilogue_probe.json); staged, the same calls took 24-26 us, and the example's dispatch ran 0.84-0.92x
# its time before at M = 64-1024 on 16384x5120 and 5120x6144, level at M <= 16 (2026-11-30u,
# results/h200_timings_2026-11-30u_example_staged_store.json). Each staged row is padded by
# OUT_ROW_PAD values (16 bytes), so that the eight rows a warp writes at once start four banks apart
# and its 4-byte writes hit 32 different banks.
OUT_ROW_PAD = 8
OUT_CHUNK = 8  # BF16 values per 16-byte store


def row_chunk_copy(rows: int, cols: int, threads: int):
    """``copy(y, tile, row0, col0, m, tx)`` (a macro): a staged ``rows x cols`` output tile to
    ``y[row0:, col0:]``, OUT_CHUNK values (16 bytes) of one row per thread and store, rows below ``m``
    only; ``tile(r, c)`` reads the staged value. maint's wgmma kernel stores through it too."""
    import tilelang.language as T

    chunks = cols // OUT_CHUNK

    @T.macro
    def copy(y, tile, row0, col0, m, tx):
        for i in T.serial(T.ceildiv(rows * chunks, threads)):
            row, col = (i * threads + tx) // chunks, (i * threads + tx) % chunks * OUT_CHUNK
            if i * threads + tx < rows * chunks and row0 + row < m:
                for v in T.vectorized(OUT_CHUNK):
                    y[row0 + row, col0 + col + v] = tile(row, col + v)

    return copy


class KernelShape(NamedTuple):
    """What the kernel template is compiled for; both config kinds map onto it."""

    block_m: int
    block_n: int
    block_k: int
    warps_m: int
    warps_n: int
    stages: int
    split_k: int
    warps_k: int = 1  # warps splitting each k tile between them (reduced through shared memory)

    @property
    def group_threads(self) -> int:
        """Threads of one k group: the warps_m x warps_n warps that cover the tile once."""
        return 32 * self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return self.group_threads * self.warps_k

    @property
    def m16_tiles_per_warp(self) -> int:
        return self.block_m // self.warps_m // 16

    @property
    def n32_blocks_per_warp(self) -> int:
        return self.block_n // self.warps_n // FRAG_N

    @property
    def acc_size(self) -> int:
        """FP32 accumulators per thread: m16 tiles x n32 blocks x four n8 tiles x four."""
        return self.m16_tiles_per_warp * self.n32_blocks_per_warp * 16

    @property
    def split_plan(self) -> "SplitPlan":
        """How this shape's split tiles meet (``SplitPlan``)."""
        return SplitPlan(self.split_k, self.block_m, self.acc_size)

    def reduction_bytes(self) -> int:
        """The FP32 accumulators k groups 1.. hand to group 0 at the end."""
        return (self.warps_k - 1) * self.group_threads * self.acc_size * 4

    def output_tile_bytes(self) -> int:
        """The staged output tile (``WarpTile.staged_store``): block_m rows of block_n + OUT_ROW_PAD
        BF16 values. TileLang's shared-memory merge places it over the pipeline's buffers, which are
        dead by then, so it costs nothing where it is no larger than they are."""
        return self.block_m * (self.block_n + OUT_ROW_PAD) * 2

    def shared_bytes(self) -> int:
        per_stage = self.block_m * self.block_k * 2 + self.block_n * self.block_k // 2
        per_stage += self.block_n * self.block_k // SCALE_BLOCK
        return self.stages * per_stage + self.reduction_bytes() + (16 if self.split_k > 1 else 0)


class WarpTile(NamedTuple):
    """The warp-level pieces every kernel of this family shares, for one :class:`KernelShape`.

    ``mma_k_tile(x_at, code_at, scale_at, a_frag, b_frag, acc, lane, warp_m, warp_n, warp_k)`` (a macro)
    accumulates k group ``warp_k``'s share of one k tile: ``x_at(row, col)``, ``code_at(nb, kb, word)``
    and ``scale_at(nb, kb, word)`` return the shared-memory elements of the tile's x, code and scale
    buffers (so the caller picks the pipeline stage). ``store_output(acc, y, alpha_x128, row0, col0, m)``
    (a macro) scales the accumulators by ``alpha * 2^7`` and writes the rows below ``m``. Accumulator
    ``q`` of a thread sits at row ``row0 + acc_row(q)``, column ``col0 + acc_col(q)``, with
    ``(row0, col0) = origin(...)``. ``staged_store(acc, out_tile, y, alpha_x128, tile_m, tile_n, lane,
    warp_m, warp_n, writes, m, tx)`` (a macro, for every thread of the CTA) does the same through the
    shared ``out_tile`` (``output_tile(T)`` allocates it): the threads with ``writes`` put their
    accumulators there, then all of them copy it out in 16-byte rows (see OUT_ROW_PAD).
    """

    acc_size: int
    acc_row: object
    acc_col: object
    origin: object
    mma_k_tile: object
    store_output: object
    staged_store: object
    output_tile: object


def scaled_store(acc_size: int):
    """``store(acc, row_of, col_of, y, alpha_x128, m)`` (a macro): accumulator ``q`` times
    ``alpha * 2^7`` of its column, as BF16, to ``y[row_of(q), col_of(q)]``, rows below ``m`` only."""
    import tilelang.language as T

    @T.macro
    def store(acc, row_of, col_of, y, alpha_x128, m):
        for q in T.unroll(acc_size):
            if row_of(q) < m:
                y[row_of(q), col_of(q)] = T.cast(acc[q] * alpha_x128[col_of(q)], T.bfloat16)

    return store


def warp_tile(shape: KernelShape) -> WarpTile:
    import tilelang.language as T

    mt, nbw = shape.m16_tiles_per_warp, shape.n32_blocks_per_warp
    warp_rows = shape.block_m // shape.warps_m
    kb_per_group = shape.block_k // FRAG_K // shape.warps_k
    acc_size = shape.acc_size

    def acc_index(mi, i, j, c):  # accumulator c of n8 tile j in fragment block i of row tile mi
        return ((mi * nbw + i) * 4 + j) * 4 + c

    # Accumulator c of (mi, i, j) holds row g + 8 (c // 2) of row tile mi and column 2t + c % 2 of
    # n8 tile j of fragment block i (g = lane // 4, t = lane % 4: the m16n8 C-fragment layout).
    def acc_row(q):
        return q // (nbw * 16) * 16 + q % 4 // 2 * 8

    def acc_col(q):
        return q // 16 % nbw * FRAG_N + q // 4 % 4 * 8 + q % 2

    def origin(tile_m, tile_n, lane, warp_m, warp_n):
        row0 = tile_m * shape.block_m + warp_m * warp_rows + lane // 4
        col0 = tile_n * shape.block_n + warp_n * nbw * FRAG_N + lane % 4 * 2
        return row0, col0

    @T.macro
    def mma_k_tile(x_at, code_at, scale_at, a_frag, b_frag, acc, lane, warp_m, warp_n, warp_k):
        for kb_of_group in T.unroll(kb_per_group):
            kb = warp_k * kb_per_group + kb_of_group
            # A fragments of both k16 steps for every row tile (ldmatrix.x4: lane l points at
            # row l % 16, column 8 * (l // 16) of a 16x16 tile).
            for s, mi in T.grid(2, mt):
                T.ptx_ldmatrix(
                    False,
                    4,
                    T.access_ptr(x_at(warp_m * warp_rows + mi * 16 + lane % 16, kb * FRAG_K + s * 16 + lane // 16 * 8), "r", extent=8),
                    T.access_ptr(a_frag[(s * mt + mi) * 8], "w", extent=8),
                )
            for i in T.unroll(nbw):
                T.call_extern(
                    "handle",
                    "nvfp4_dequant_block",
                    T.address_of(code_at(warp_n * nbw + i, kb, lane * 4)),
                    T.address_of(scale_at(warp_n * nbw + i, kb, lane // 4 * 2)),
                    T.address_of(b_frag[0]),
                )
                # The B register pair of (n8 tile j, k16 step s) sits at bf16 offset 8j + 4s.
                for s, j, mi in T.grid(2, 4, mt):
                    T.ptx_mma(
                        T.float32, "m16n8k16", "row", "col", "bf16", "bf16", "fp32",
                        a_frag.data, (s * mt + mi) * 8,
                        b_frag.data, j * 8 + s * 4,
                        acc.data, acc_index(mi, i, j, 0),
                        False,
                    )  # fmt: skip

    store = scaled_store(acc_size)

    @T.macro
    def store_output(acc, y, alpha_x128, row0, col0, m):
        store(acc, lambda q: row0 + acc_row(q), lambda q: col0 + acc_col(q), y, alpha_x128, m)

    bm_, bn_ = shape.block_m, shape.block_n
    copy_out = row_chunk_copy(bm_, bn_, shape.threads)

    def output_tile(T):
        return T.alloc_shared((bm_, bn_ + OUT_ROW_PAD), T.bfloat16)

    @T.macro
    def staged_store(acc, out_tile, y, alpha_x128, tile_m, tile_n, lane, warp_m, warp_n, writes, m, tx):
        row0, col0 = origin(0, 0, lane, warp_m, warp_n)  # within the tile
        T.sync_threads()  # the last readers of the buffers out_tile lies over are done
        if writes:
            for q in T.unroll(acc_size):
                out_tile[row0 + acc_row(q), col0 + acc_col(q)] = T.cast(acc[q] * alpha_x128[tile_n * bn_ + col0 + acc_col(q)], T.bfloat16)
        T.sync_threads()
        copy_out(y, lambda r, c: out_tile[r, c], tile_m * bm_, tile_n * bn_, m, tx)

    return WarpTile(acc_size, acc_row, acc_col, origin, mma_k_tile, store_output, staged_store, output_tile)


# How a split tile's partials travel: each CTA writes its piece to a slot of the tile, in fragment
# order (``PartialSlots``), and the CTA that reduces the tile reads the slots back. Every address is
# the slot's base plus a constant. The marked exchange (``marked_exchange``) moves whole slots, four
# accumulators per 16-byte access: guarding each quadruple by its rows (a runtime mask) cost 1.5-2.3
# us a call in branches around every access (H200, 2026-12-03). The ticket exchange moves whole
# slots where more than half of the tile's rows are real, one split at a time; elsewhere (M = 1 in a
# 16-row tile: 2 of 16 accumulators real) only the real rows, one accumulator at a time under its
# row guard; nvcc then issues the loads one accumulator after another, but there are few of them.
# Row-major partials, [split, M, N], needed a 64-bit address per accumulator, and two warpgroups of
# 128 accumulators spilled registers: 5120x6144 at M = 256, split 3, took 72.2 us where the same
# CTAs without an exchange (15360x2048, unsplit) took 32.1; with slots it takes 47.7 (H200,
# 2026-11-30m).
DENSE_EXCHANGE_MIN_FILL = 2  # M * this > the tile's rows: whole slots, 16 bytes at a time
# Where a thread's accumulators times the splits are at most this many, the reducing CTA issues
# every split's loads at once: 4 L2 round trips became one for the skinny kernel at M = 5-8, split 4
# (3.5-4.5 % of the call at M = 8 on 5120x6144, 4096x4096 and 6144x4096; H200, 2026-12-01,
# results/h200_ab_2026-12-01k_exchange_batch.json in maint/gemm/gemm_sm120), and 16-row fragment
# tiles (16 accumulators) at split 4 took 0-2 more registers (ptxas, sm_90a). Those exchanges are
# also the marked ones (``marked_exchange``). Above it, one split at a time (see ``split_k_exchange``).
EXCHANGE_BATCH_LOADS = 64


def marked_exchange(split_k: int, acc_size: int) -> bool:
    """Whether a split launch's partials carry their own readiness (``split_k_exchange``): where the
    reducer loads every piece in one L2 round trip (``acc_size * split_k <= EXCHANGE_BATCH_LOADS``).
    Against the ticket exchange the skinny kernel took 0.89-0.97x the time at M = 1-16 (split 2 and
    4, twelve cells) and the 16-row fragment tile 0.89x at M = 1, split 4; wgmma tiles of 24-48 rows
    0.94-1.03x, by shape (the wgmma configs choose: ``tickets`` there). Where every piece took several
    trips (two warpgroups of 64 accumulators, split 4) the reducer's polling cost more than the
    tickets' extra round trips: 1.07x (H200, 2026-12-03,
    results/h200_ab_2026-12-03a_marked_exchange.json in maint/gemm/gemm_sm120)."""
    return split_k > 1 and acc_size * split_k <= EXCHANGE_BATCH_LOADS


class SplitPlan(NamedTuple):
    """How a launch's split tiles meet: ``split_k`` pieces of each tile of ``block_rows`` x rows, whose
    owner threads hold ``acc_size`` accumulators each, through the marked exchange where it fits
    (``marked_exchange``) unless ``tickets``. A kernel's builder hands it to ``split_k_exchange`` and
    its launcher to ``split_k_buffers``, both from the config's one ``split_plan``, so that a kernel
    never meets memory prepared for the other form."""

    split_k: int
    block_rows: int
    acc_size: int
    tickets: bool = False

    @property
    def marked(self) -> bool:
        return marked_exchange(self.split_k, self.acc_size) and not self.tickets


class PartialSlots(NamedTuple):
    """Macros moving the ``acc_size`` FP32 accumulators of each of ``threads`` threads to and from a
    partial slot (``acc_size * threads`` values, ``[acc_size / 4][threads][4]``: a warp's 16-byte
    accesses cover 512 contiguous bytes). ``store(acc, partials, slot, tx)`` writes them,
    ``add(acc, partials, slot, tx)`` adds them to ``acc`` and ``load(acc, partials, slot, tx)`` reads
    them into it, 16 bytes at a time; ``element(slot, q, tx)`` is the index of accumulator ``q``, for
    moving a few one at a time."""

    store: object
    add: object
    element: object
    load: object


def partial_slots(acc_size: int, threads: int) -> PartialSlots:
    """The ``PartialSlots`` of a CTA whose first ``threads`` threads hold ``acc_size`` accumulators each."""
    import tilelang.language as T

    if acc_size % 4:
        raise ValueError(f"partial slots move accumulators four at a time; {acc_size} per thread is not a multiple of 4")

    def element(slot, q, tx):
        return ((slot * (acc_size // 4) + q // 4) * threads + tx) * 4 + q % 4

    def four(partials, slot, q4, tx, access):
        """Pointer to accumulators ``4 q4 ..`` of thread ``tx`` in ``slot``."""
        return T.access_ptr(partials[element(slot, q4 * 4, tx)], access, extent=4)

    @T.macro
    def store(acc, partials, slot, tx):
        for q4 in T.unroll(acc_size // 4):
            T.evaluate(T.call_extern("handle", "nvfp4_store_partials4", four(partials, slot, q4, tx, "w"), T.address_of(acc[q4 * 4])))

    @T.macro
    def add(acc, partials, slot, tx):
        for q4 in T.unroll(acc_size // 4):
            T.evaluate(T.call_extern("handle", "nvfp4_add_partials4", T.address_of(acc[q4 * 4]), four(partials, slot, q4, tx, "r")))

    @T.macro
    def load(acc, partials, slot, tx):
        for q4 in T.unroll(acc_size // 4):
            T.evaluate(T.call_extern("handle", "nvfp4_load_partials4", T.address_of(acc[q4 * 4]), four(partials, slot, q4, tx, "r")))

    return PartialSlots(store, add, element, load)


class SplitKExchange(NamedTuple):
    """``split_k_exchange``'s macro, ``run``, and ``reduces(ticket, split_index)``: the condition, the
    same for every thread of a CTA, under which the CTA holds the tile's sums after ``run``."""

    run: object
    reduces: object


def split_k_exchange(plan: SplitPlan, owner_threads: int, sync=None) -> SplitKExchange:
    """The deterministic split-K reduction the kernels of this family share, as ``plan`` says.

    ``run(acc, row_of, partials, tickets, ticket, tile, split_index, m, tx, owner)``: the ``owner``
    threads (the first ``owner_threads`` of the CTA) hold the accumulators of ``tile`` (accumulator
    ``q`` in output row ``row_of(q)``) and write them to slot ``tile * split_k + split_index``
    (``partial_slots``) of ``partials`` (sized by ``split_k_buffers``). One CTA of the tile reads
    every split back and adds them in split order, so the sum does not depend on arrival order and
    is the same in both forms below; afterwards its owners hold the sums in ``acc``.

    Marked (``plan.marked``): ``partials`` is the device's marked workspace, every word
    PARTIAL_MARK (a NaN) between launches. The tile's last split reduces: the others post their
    pieces, whole slots; it loads them all at once, loads again those still marked, adds, and marks
    them again for the next launch (PARTIALS_SOURCE). No barrier, fence or atomic sits between the
    last MMA and the sum: one L2 round trip where the ticket takes three. The reducer waits only for
    CTAs before it in launch order (the split index is a slower grid index than the tile's column,
    or, split fastest, the tile's splits are consecutive), so it never waits for one that cannot
    start: GPUs start a grid's CTAs in launch order.

    Ticket (otherwise): the pieces go to fresh partials: whole slots where ``m *
    DENSE_EXCHANGE_MIN_FILL > block_rows`` (the tile's rows), else only the accumulators of rows
    below ``m``. The CTA that takes the last of the tile's tickets reads every split back (its own
    included) and resets the ticket for the next launch. ``sync()`` emits the barrier of the threads
    that take part (thread 0 among them); by default the whole CTA's. Memory order, the semaphore
    pattern: the barrier puts the owners' partial stores before thread 0's ticket, whose ``acq_rel``
    atomic releases them at GPU scope (release is cumulative) and acquires those of the CTAs before
    it; the second barrier passes that on to the owners, whose ``__ldcg`` loads skip L1. With a
    ``__threadfence`` (``MEMBAR.SC.GPU`` in every thread) before the ticket and another after it,
    the skinny kernel's split configs took 0.2-0.35 us more per call at M = 1-4 (H200, 2026-12-01,
    NOTES twenty-ninth session).
    """
    import tilelang.language as T

    split_k, acc_size, block_rows = plan.split_k, plan.acc_size, plan.block_rows
    sync = sync or T.sync_threads
    slots = partial_slots(acc_size, owner_threads)

    post = f"nvfp4_post_partials<{acc_size // 4}>"  # PARTIALS_SOURCE
    take = f"nvfp4_take_partials<{acc_size // 4}, {split_k - 1}>"
    quad_stride, slot_floats = owner_threads * 4, acc_size * owner_threads  # ``partial_slots``' layout

    def piece(partials, slot, tx):
        """Where thread ``tx``'s piece starts in ``slot`` (an expression: a name bound to the load fails codegen)."""
        return T.address_of(partials[slots.element(slot, 0, tx)])

    @T.macro
    def marked(acc, row_of, partials, tickets, ticket, tile, split_index, m, tx, owner):
        if owner:
            if split_index < split_k - 1:
                T.evaluate(T.call_extern("handle", post, piece(partials, tile * split_k + split_index, tx), T.address_of(acc[0]), quad_stride))
            else:
                T.evaluate(T.call_extern("handle", take, T.address_of(acc[0]), piece(partials, tile * split_k, tx), quad_stride, slot_floats))

    @T.macro
    def ticketed(acc, row_of, partials, tickets, ticket, tile, split_index, m, tx, owner):
        dense = m * DENSE_EXCHANGE_MIN_FILL > block_rows
        if owner:
            if dense:
                slots.store(acc, partials, tile * split_k + split_index, tx)
            else:
                for q in T.unroll(acc_size):
                    if row_of(q) < m:
                        partials[slots.element(tile * split_k + split_index, q, tx)] = acc[q]
        sync()
        if tx == 0:
            ticket[0] = T.atomic_add(tickets[tile], 1, memory_order="acq_rel", return_prev=True)
        sync()
        if ticket[0] == split_k - 1 and owner:
            for q in T.unroll(acc_size):
                acc[q] = 0.0
            if dense:
                # One split at a time (#pragma unroll 1): the ticket form runs past EXCHANGE_BATCH_LOADS
                # (within it the exchange is marked), where unrolled, every split's loads went in
                # flight together and the register count, which holds for the whole kernel, rose
                # (16-row fragment tile at split 8: 160 against 96; ptxas, sm_90a).
                for sk in T.unroll(split_k, annotations={"pragma_unroll_factor": 1}):
                    slots.add(acc, partials, tile * split_k + sk, tx)
            else:
                for q in T.unroll(acc_size):
                    if row_of(q) < m:
                        for sk in T.serial(split_k):
                            at = slots.element(tile * split_k + sk, q, tx)
                            acc[q] += T.call_extern("float32", "__ldcg", T.access_ptr(partials[at], "r", extent=1))
            if tx == 0:
                tickets[tile] = 0

    if plan.marked:
        return SplitKExchange(marked, lambda ticket, split_index: split_index == split_k - 1)
    return SplitKExchange(ticketed, lambda ticket, split_index: ticket[0] == split_k - 1)


class Operands(NamedTuple):
    """The tensor types every kernel of this family takes, for an ``N x K`` weight and ``M`` rows:
    the operands, then the split-K workspace (FP32 partials and tickets, sized by the launcher)."""

    x: object
    codes: object
    scales: object
    alpha_x128: object
    y: object
    partials: object
    tickets: object


def operands(n: int, k: int, m) -> Operands:
    import tilelang.language as T

    return Operands(
        x=T.Tensor((m, k), T.bfloat16),
        codes=T.Tensor((n // FRAG_N, k // FRAG_K, WORDS_PER_BLOCK), T.int32),
        scales=T.Tensor((n // FRAG_N, k // FRAG_K, SCALE_WORDS_PER_BLOCK), T.int32),
        alpha_x128=T.Tensor((n,), T.float32),
        y=T.Tensor((m, n), T.bfloat16),
        partials=T.Tensor((T.dynamic("partials_len"),), T.float32),
        tickets=T.Tensor((T.dynamic("tickets_len"),), T.int32),
    )


def build_kernel(n: int, k: int, shape: KernelShape):
    """The TileLang kernel for an ``N x K`` weight.

    Grid: (N / block_n, split_k, ceil(M / block_m)). Each CTA streams its K range through a
    ``T.Pipelined`` cp.async pipeline (x tile, code blocks, scale blocks); each warp owns
    ``m16_tiles_per_warp`` row tiles and ``n32_blocks_per_warp`` fragment blocks. With warps_k > 1 the
    CTA holds that many such warp groups, each taking a slice of every k tile (more warps per SM where
    the tiles alone give each scheduler one warp; on the H200 it wins some N = 5120 cells at M = 9-32,
    not M = 1, where the ALU pipe saturates first); group 0 adds the others' accumulators, in group
    order, from shared memory. With split_k > 1 the CTAs exchange FP32 partials
    (``split_k_exchange``): bit-identical results from call to call.
    """
    import tilelang.language as T
    from tilelang.layout import make_swizzled_layout

    bm_, bn_, bk_, split_k = shape.block_m, shape.block_n, shape.block_k, shape.split_k
    k_tiles = k // split_k // bk_
    wt = warp_tile(shape)
    exchange = split_k_exchange(shape.split_plan, shape.group_threads)
    M = T.dynamic("m")
    ops = operands(n, k, M)

    @T.prim_func
    def nvfp4_w4a16_gemm(
        x: ops.x,
        codes: ops.codes,
        scales: ops.scales,
        alpha_x128: ops.alpha_x128,
        y: ops.y,
        partials: ops.partials,
        tickets: ops.tickets,
    ):
        with T.Kernel(n // bn_, split_k, T.ceildiv(M, bm_), threads=shape.threads) as (bn, bk, bm):
            x_tile = T.alloc_shared((bm_, bk_), T.bfloat16)
            code_tile = T.alloc_shared((bn_ // FRAG_N, bk_ // FRAG_K, WORDS_PER_BLOCK), T.int32)
            scale_tile = T.alloc_shared((bn_ // FRAG_N, bk_ // FRAG_K, SCALE_WORDS_PER_BLOCK), T.int32)
            a_frag = T.alloc_local((2 * shape.m16_tiles_per_warp * 8,), T.bfloat16)
            b_frag = T.alloc_local((32,), T.bfloat16)
            acc = T.alloc_local((wt.acc_size,), T.float32)
            out_tile = wt.output_tile(T)
            T.import_source(DEVICE_SOURCE)
            T.annotate_layout({x_tile: make_swizzled_layout(x_tile)})
            tx = T.get_thread_binding()
            lane = tx % 32
            group_tx = tx % shape.group_threads
            warp_m = group_tx // 32 // shape.warps_n
            warp_n = group_tx // 32 % shape.warps_n
            warp_k = tx // shape.group_threads
            for q in T.unroll(wt.acc_size):
                acc[q] = 0.0
            for ko in T.Pipelined(k_tiles, num_stages=shape.stages):
                k0 = (bk * k_tiles + ko) * bk_
                # Plain cp.async (no TMA) on every arch: one loader for sm_90 and sm_120.
                T.copy(x[bm * bm_, k0], x_tile, disable_tma=True)
                T.copy(codes[bn * (bn_ // FRAG_N), k0 // FRAG_K, 0], code_tile, disable_tma=True)
                T.copy(scales[bn * (bn_ // FRAG_N), k0 // FRAG_K, 0], scale_tile, disable_tma=True)
                wt.mma_k_tile(
                    lambda r, c: x_tile[r, c],
                    lambda nb, kb, w: code_tile[nb, kb, w],
                    lambda nb, kb, w: scale_tile[nb, kb, w],
                    a_frag, b_frag, acc, lane, warp_m, warp_n, warp_k,
                )  # fmt: skip
            if shape.warps_k > 1:
                # Thread-fastest order: the stores and loads of a warp hit 32 different banks.
                handoff = T.alloc_shared((shape.warps_k - 1, wt.acc_size, shape.group_threads), T.float32)
                if warp_k > 0:
                    for q in T.unroll(wt.acc_size):
                        handoff[warp_k - 1, q, group_tx] = acc[q]
                T.sync_threads()
                if warp_k == 0:
                    for g, q in T.grid(shape.warps_k - 1, wt.acc_size):
                        acc[q] += handoff[g, q, group_tx]
            if split_k == 1:
                wt.staged_store(acc, out_tile, y, alpha_x128, bm, bn, lane, warp_m, warp_n, warp_k == 0, M, tx)
            else:
                row0, _ = wt.origin(bm, bn, lane, warp_m, warp_n)
                ticket = T.alloc_shared((1,), T.int32)
                exchange.run(acc, lambda q: row0 + wt.acc_row(q), partials, tickets, ticket, bm * (n // bn_) + bn, bk, M, tx, warp_k == 0)
                if exchange.reduces(ticket, bk):  # the same for every thread: the CTA stores together
                    wt.staged_store(acc, out_tile, y, alpha_x128, bm, bn, lane, warp_m, warp_n, warp_k == 0, M, tx)

    return nvfp4_w4a16_gemm


# ----------------------------------------------------------------------------------------------
# 4. Configs and the heuristic
# ----------------------------------------------------------------------------------------------


def config_type(cls):
    """Class decorator for the config NamedTuples: equal only to a config of the same type. As plain
    tuples a TileConfig and a StreamKConfig (maint) with the same seven numbers would compare and
    hash equal, and a set or dict of candidates would keep one of them."""
    cls.__eq__ = lambda self, other: type(self) is type(other) and tuple.__eq__(self, other)
    cls.__ne__ = lambda self, other: not self == other
    cls.__hash__ = lambda self: hash((cls.__name__, tuple(self)))
    return cls


@config_type
class FragConfig(NamedTuple):
    """Fragment kernel: one CTA row of ``block_m <= 64`` rows, one warp per 32 columns, split-K on
    grid.y. For decode-sized M; larger M runs as several ``block_m``-row passes (grid.z)."""

    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    split_k: int = 1
    stages: int = 4
    warps_k: int = 1

    def kernel_shape(self) -> KernelShape:
        return KernelShape(
            self.block_m, self.block_n, self.block_k, 1, self.block_n // FRAG_N, self.stages, self.split_k, self.warps_k
        )


@config_type
class TileConfig(NamedTuple):
    """Tile kernel: a ``block_m x block_n`` tile per CTA over a ``warps_m x warps_n`` warp grid."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    warps_m: int = 2
    warps_n: int = 2
    split_k: int = 1
    stages: int = 4

    def kernel_shape(self) -> KernelShape:
        return KernelShape(self.block_m, self.block_n, self.block_k, self.warps_m, self.warps_n, self.stages, self.split_k)


Config = Union[FragConfig, TileConfig]
FRAG_MAX_BLOCK_M = 64
FRAG_MAX_M = 96  # the heuristic's fragment-kernel range: up to two 64-row passes
MAX_ACCUMULATORS = 128  # FP32 accumulators per thread; more would spill on 4-warp CTAs
MAX_SPLIT_K = 16
DEFAULT_STAGES = 4  # cp.async stages the heuristic uses; deeper pipelines measured slower on the H200


def _field_ok(config, name: str, value) -> bool:
    if type(config).__annotations__[name] is bool:  # a switch (the maint wgmma configs' tma_loads)
        return isinstance(value, bool)
    # An int field is positive unless its config type names a lower minimum in ``FIELD_MINIMUMS``.
    return isinstance(value, int) and not isinstance(value, bool) and value >= getattr(config, "FIELD_MINIMUMS", {}).get(name, 1)


def check_config(config: Config, n: int, k: int, config_types=(FragConfig, TileConfig)) -> None:
    """Raise ``ValueError`` unless ``config`` divides an ``n x k`` weight and fits sm_120 (or, for a
    config type with a ``SHARED_BYTES_PER_CTA`` attribute, the one arch that type runs on). Row blocks
    are multiples of 16 (the m16 MMA tile) unless the config type names its own ``BLOCK_M_STEP``."""
    if not isinstance(config, config_types):
        names = " or ".join(t.__name__ for t in config_types)
        raise TypeError(f"config must be a {names}, got {type(config).__name__}")
    s = config.kernel_shape()
    problems = []
    if not all(_field_ok(config, name, v) for name, v in zip(config._fields, config)):
        problems.append("every int field must be a positive int (or at least its FIELD_MINIMUMS entry), every bool field a bool")
    else:
        if isinstance(config, FragConfig) and config.block_m > FRAG_MAX_BLOCK_M:
            problems.append(f"FragConfig.block_m must be <= {FRAG_MAX_BLOCK_M}")
        block_m_step = getattr(config, "BLOCK_M_STEP", 16)
        if s.block_m % (block_m_step * s.warps_m):
            problems.append(f"block_m must be a multiple of {block_m_step} * warps_m")
        if s.block_n % (FRAG_N * s.warps_n) or n % s.block_n:
            problems.append(f"block_n must be a multiple of 32 * warps_n and divide N={n}")
        if s.block_k % (FRAG_K * s.warps_k):
            problems.append("block_k must be a multiple of 32 * warps_k")
        # A config type whose kernel gives a split the rest of an uneven division says UNEVEN_SPLIT_K.
        uneven_split = getattr(config, "UNEVEN_SPLIT_K", False)
        if s.block_k % FRAG_K or k % s.block_k or (k // s.block_k % s.split_k and not uneven_split):
            problems.append(f"block_k must be a multiple of 32 and block_k {'' if uneven_split else '* split_k '}must divide K={k}")
        elif k // s.block_k // s.split_k < s.stages:
            problems.append(f"each split must hold at least `stages` k tiles (K={k})")
        if s.split_k > MAX_SPLIT_K:
            problems.append(f"split_k must be <= {MAX_SPLIT_K}")
        smem_per_cta = getattr(config, "SHARED_BYTES_PER_CTA", SM120_SMEM_PER_CTA)
        if s.shared_bytes() > smem_per_cta:
            problems.append(f"needs {s.shared_bytes()} bytes of shared memory, the arch has {smem_per_cta} per CTA")
        if isinstance(config, (FragConfig, TileConfig)) and s.output_tile_bytes() > s.shared_bytes():
            problems.append(f"its staged output tile ({s.output_tile_bytes()} bytes) must fit in the pipeline's {s.shared_bytes()}: add stages")
        max_accumulators = getattr(config, "MAX_ACCUMULATORS", MAX_ACCUMULATORS)
        if s.m16_tiles_per_warp * s.n32_blocks_per_warp * 16 > max_accumulators:
            problems.append(f"a warp tile needs more than {max_accumulators} accumulators per thread")
        if s.threads > 512:
            problems.append("at most 16 warps per CTA")
    if problems:
        raise ValueError(f"config {config} does not fit N={n}, K={k}: " + "; ".join(problems))


def sm_imbalance(ctas: int, sm_count: int) -> float:
    """The busiest SM's CTAs over the mean, ``ctas`` dealt round-robin over ``sm_count`` SMs."""
    return math.ceil(ctas / sm_count) / (ctas / sm_count)


def _split_k(tiles: int, m: int, n: int, k: int, block_k: int, stages: int, target_ctas: int, sm_count: int) -> int:
    """Split K only when the output tiles would leave half of the SMs idle; then double the split
    until there are ``target_ctas`` CTAs, keeping at least ``stages`` k tiles per split and the
    partials' traffic (an FP32 write and read of ``M x N`` per split and launch) within the weight
    bytes. The bound counts real rows, as when it was fitted; where more than half of a tile's rows
    are real the exchange moves whole tiles (``DENSE_EXCHANGE_MIN_FILL``), up to twice those bytes."""
    m = min(m, MAX_M_PER_LAUNCH)
    split = 1
    while (
        2 * tiles < sm_count
        and tiles * split < target_ctas
        and 2 * (split * 2) * m * n * 4 <= n * k * WEIGHT_BYTES_PER_CODE
        and split * 2 <= MAX_SPLIT_K
        and k % (block_k * split * 2) == 0
        and k // (block_k * split * 2) >= stages
    ):
        split *= 2
    return split


# Unsplit output tiles that load the SMs unevenly (between half and all of the SMs, or just past a
# whole number of waves) leave SMs idle for the whole call. So where the busiest SM would hold
# UNEVEN_MIN_IMBALANCE times the mean, the 16-row tile takes the split (a power of two up to
# EVENING_MAX_SPLIT) that gives the busiest SM the fewest k tiles, a larger split only where it cuts
# them to EVENING_MAX_BUSIEST of the smaller one's, and only while the FP32 partials' traffic stays
# within EVENING_MAX_PARTIALS of the weight bytes. H200 (2026-11-30g), fragment kernel, split 4
# against the unsplit heuristic, us: 11008x4096 (86 tiles) M = 1 13.7 / 15.2, M = 8 15.2 / 16.0;
# 34816x5120 (272 tiles) M = 1 36.0 / 42.8, M = 4 37.3 / 42.8, M = 8 40.8 / 43.6 (partials 9-11 % of
# the weight bytes). At M = 16 split 4 (partials 18-22 %) lost, 48.7 / 45.1 and over 16.7 / 16.5, and
# so did split 2 at 34816x5120 (46.7, a 17 % cut of the busiest SM's k tiles): the idle SMs cost
# less than the busiest SM's share suggests, since the busy ones stream faster. Split 8 gained
# nothing over 4 there (36.3 at M = 1; 39.6 against 37.3 at M = 4). Not yet measured on sm_120.
UNEVEN_MIN_IMBALANCE = 1.2
EVENING_MAX_SPLIT = 8
EVENING_MAX_BUSIEST = 0.8
EVENING_MAX_PARTIALS = 1 / 8


def loads_sms_unevenly(ctas: int, sm_count: int) -> bool:
    """Whether ``ctas`` leave the busiest SM ``UNEVEN_MIN_IMBALANCE`` times the mean or more."""
    return sm_imbalance(ctas, sm_count) >= UNEVEN_MIN_IMBALANCE


def _evening_split(tiles: int, m: int, k: int, block_k: int, stages: int, sm_count: int) -> int:
    """The split ``get_config`` gives 16-row tiles that ``_split_k`` left unsplit (see
    ``UNEVEN_MIN_IMBALANCE``)."""
    best = 1
    if not loads_sms_unevenly(tiles, sm_count):
        return best
    k_tiles = k // block_k
    busiest = lambda split: math.ceil(tiles * split / sm_count) * k_tiles / split  # noqa: E731
    split = 2
    while (
        split <= EVENING_MAX_SPLIT
        and k_tiles % split == 0
        and k_tiles // split >= stages
        and 2 * split * min(m, MAX_M_PER_LAUNCH) * 4 <= EVENING_MAX_PARTIALS * k * WEIGHT_BYTES_PER_CODE
    ):
        if busiest(split) <= EVENING_MAX_BUSIEST * busiest(best):
            best = split
        split *= 2
    return best


def get_config(m: int, n: int, k: int, *, sm_count: int = 132) -> Config:
    """A shape-independent heuristic (no per-shape table; maint's tuned tables do that).

    M <= 96: the fragment kernel with the smallest row block that covers M (64-row passes above 64),
    128 x 128 weight tiles (128 x 64 where only that lets split-K fill the SMs), split-K to about
    two CTAs per SM where the tiles are too few (several small CTAs stream per SM), and for 16-row
    tiles that would load the SMs unevenly to the split that evens them (``_evening_split``). Larger M: 64-row
    tiles over four warps (two where N % 256 != 0), split-K to about one wave where the tiles are too
    few. Split-K stops where the FP32 partials would cost more traffic than the weights.
    Measured on the H200 (2026-11-29) against the other candidates of the same family; the split
    limit and the 64-deep tiles from the untuned-shape benchmark of 2026-11-30 (maint NOTES.md).
    """
    if m <= FRAG_MAX_M:
        block_m = min(FRAG_MAX_BLOCK_M, 16 * math.ceil(m / 16))
        stages = DEFAULT_STAGES if block_m <= 48 else DEFAULT_STAGES - 1  # 64 x 128 x tiles: 4 stages > 99 KB
        tiles = n // 128 * math.ceil(m / block_m)
        block_k = 128
        split = _split_k(tiles, m, n, k, block_k, stages, 2 * sm_count, sm_count)
        if tiles * split < sm_count:  # K / 128 has too few factors of 2 (K = 11008: 2 x 43)
            split_64 = _split_k(tiles, m, n, k, 64, stages, 2 * sm_count, sm_count)
            if split_64 > split:
                block_k, split = 64, split_64
        if block_m == 16 and split == 1:
            split = _evening_split(tiles, m, k, block_k, stages, sm_count)
        return FragConfig(block_m, 128, block_k, split, min(stages, k // (block_k * split)))
    block_n = 256 if n % 256 == 0 else 128
    tiles = n // block_n * math.ceil(min(m, MAX_M_PER_LAUNCH) / 64)
    split = _split_k(tiles, m, n, k, 64, DEFAULT_STAGES, sm_count, sm_count)
    return TileConfig(64, block_n, 64, 1, block_n // 64, split, min(DEFAULT_STAGES, k // (64 * split)))


# ----------------------------------------------------------------------------------------------
# 5. Dispatch and the public function
# ----------------------------------------------------------------------------------------------

# TileLang's automatic warp specialization emits setmaxnreg, which sm_120 lacks.
PASS_CONFIGS = {"tl.disable_warp_specialized": True}


def compile_kernel(n: int, k: int, config: Config, arch: str):
    """Lower and compile the kernel for ``arch`` (e.g. "sm_90", "sm_120"); needs nvcc, not a GPU."""
    import tilelang

    check_config(config, n, k)
    func = build_kernel(n, k, config.kernel_shape())
    return tilelang.compile(func, target={"kind": "cuda", "arch": arch}, pass_configs=PASS_CONFIGS)


def precompile(jobs, arch: str, compile_fn=None) -> None:
    """Compile ``(n, k, config)`` jobs for ``arch`` in parallel processes. TileLang's disk cache then
    turns each in-process first compile into a load (minutes of nvcc become seconds); useful before a
    tuning run, a test session or a CUDA-graph capture. ``compile_fn(n, k, config, arch)`` must be a
    module-level function (it crosses processes); the default compiles this module's kernels."""
    import concurrent.futures
    import multiprocessing
    import os

    compile_fn = compile_fn or compile_kernel
    context = multiprocessing.get_context("spawn")  # a forked CUDA/TVM process is not safe to reuse
    with concurrent.futures.ProcessPoolExecutor(min(16, os.cpu_count() or 1), mp_context=context) as pool:
        for future in [pool.submit(_compile_for_cache, compile_fn, n, k, config, arch) for n, k, config in set(jobs)]:
            future.result()


def _compile_for_cache(compile_fn, n, k, config, arch) -> None:
    compile_fn(n, k, config, arch)  # the kernel object stays in the worker: only the disk cache matters


# (N, K, kernel shape, device index) -> compiled kernel. A dict lookup costs ~0.4 us, against
# ~0.7 us for the JIT factory's own cache: it matters next to a 10-30 us decode GEMM.
_KERNELS: dict = {}


def _kernel_for(n: int, k: int, config: Config, device: torch.device):
    key = (n, k, config.kernel_shape(), device.index)
    kernel = _KERNELS.get(key)
    if kernel is None:  # compiling and loading inside a CUDA-graph capture is fine (checked on sm_90)
        kernel = _KERNELS[key] = compile_kernel(n, k, config, device_arch(device))
    return kernel


@dataclasses.dataclass
class _Workspace:
    """Per-device split-K state: self-resetting tickets, the marked partials (every word PARTIAL_MARK
    between launches; grown by ``split_k_buffers``) and a one-element stand-in for partials."""

    tickets: torch.Tensor
    marked_partials: torch.Tensor
    no_partials: torch.Tensor


_WORKSPACES: dict[torch.device, _Workspace] = {}
# Workspaces outgrown by a larger weight or launch, kept alive: a CUDA graph captured before the
# growth still launches with their tickets and marked partials, which every launch leaves reset and
# marked as the new ones. Freed, their memory would go to other tensors, and a split-K launch
# replayed from such a graph would count on it.
_OUTGROWN_WORKSPACES: list[_Workspace] = []


def _tickets_needed(n: int) -> int:
    return n // FRAG_N * (MAX_M_PER_LAUNCH // 16)  # one per output tile of the smallest tiles


def _ensure_workspace(device: torch.device, tickets: int = 0, marked_partials: int = 0) -> _Workspace:
    """The device's workspace, grown to at least ``tickets`` tickets and ``marked_partials`` FP32
    partials (to the next power of two, so that launches of growing M do not grow it every time)."""
    ws = _WORKSPACES.get(device)
    if ws is not None and ws.tickets.numel() >= tickets and ws.marked_partials.numel() >= marked_partials:
        return ws
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"the split-K workspace for {device} must be created or grown outside a CUDA-graph capture: "
            "call prepare_nvfp4_weight on this device, and run each call to be captured once (the same "
            "weight shape, M and config), before capturing"
        )
    if ws is not None:
        _OUTGROWN_WORKSPACES.append(ws)
        tickets, marked_partials = max(tickets, ws.tickets.numel()), max(marked_partials, ws.marked_partials.numel())
    marked_partials = 1 << (marked_partials - 1).bit_length() if marked_partials else 0
    ws = _WORKSPACES[device] = _Workspace(
        tickets=torch.zeros(max(tickets, 1), dtype=torch.int32, device=device),
        marked_partials=torch.full((marked_partials,), PARTIAL_MARK - 2**32, dtype=torch.int32, device=device).view(torch.float32),
        no_partials=torch.zeros(1, dtype=torch.float32, device=device),
    )
    return ws


def device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


_SM_COUNTS: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    if device.index not in _SM_COUNTS:
        _SM_COUNTS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNTS[device.index]


def split_k_buffers(x: torch.Tensor, w: NVFP4W4A16Weight, plan: SplitPlan, split_n: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials, tickets)`` for a launch whose split tiles meet as ``plan`` says: FP32 partials for
    ``plan.split_k`` pieces of every tile of the first ``split_n`` weight rows' worth (all of them by
    default), padded rows included (``split_k_exchange``: from the device's marked workspace where
    ``plan.marked``, else fresh; a stand-in without a split), and the device's self-resetting
    tickets."""
    split_k, block_rows, split_rows = plan.split_k, plan.block_rows, split_n or w.n
    size = split_k * -(-x.shape[0] // block_rows) * block_rows * split_rows if split_k > 1 else 0
    if size >= 2**31:
        raise ValueError(f"config: split_k={split_k} partials of {x.shape[0]}x{split_rows} in {block_rows}-row tiles exceed 32-bit offsets")
    ws = _ensure_workspace(w.device, tickets=_tickets_needed(w.n), marked_partials=size if plan.marked else 0)
    if split_k == 1:
        return ws.no_partials, ws.tickets
    if plan.marked:
        return ws.marked_partials, ws.tickets
    return torch.empty(size, dtype=torch.float32, device=x.device), ws.tickets


def launch(x: torch.Tensor, w: NVFP4W4A16Weight, config: Config, out: torch.Tensor) -> None:
    """One launch of the fragment or tile kernel on checked inputs (at most 1024 rows)."""
    shape = config.kernel_shape()
    partials, tickets = split_k_buffers(x, w, shape.split_plan)
    _kernel_for(w.n, w.k, config, w.device)(x, w.codes, w.scales, w.alpha_x128, out, partials, tickets)


def run_linear(x, w, config, out, pick_config, launchers: dict) -> torch.Tensor:
    """The host side every dispatch shares: the input checks, 1024-row chunks, and per chunk
    ``launchers[type(config)](x, w, config, out)`` with ``config`` or ``pick_config(rows, w)``."""
    x, out = check_linear_inputs(x, w, config, out, tuple(launchers))
    for start in range(0, x.shape[0], MAX_M_PER_LAUNCH):
        rows = min(MAX_M_PER_LAUNCH, x.shape[0] - start)
        chunk_config = config if config is not None else pick_config(rows, w)
        launchers[type(chunk_config)](x[start : start + rows], w, chunk_config, out[start : start + rows])
    return out


def nvfp4_w4a16_linear(
    x: torch.Tensor, w: NVFP4W4A16Weight, config: Config | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``y = x @ W^T * alpha`` for BF16 ``x`` ``[M, K]`` and a prepared NVFP4 weight; BF16 ``[M, N]``.

    ``config`` overrides the heuristic for every chunk; ``out`` (BF16 ``[M, N]``, contiguous,
    16-byte aligned, on x's device) receives the result. M > 1024 runs in 1024-row chunks.
    Deterministic, and capturable in a CUDA graph.
    """
    return run_linear(x, w, config, out, _heuristic_config, {FragConfig: launch, TileConfig: launch})


def _heuristic_config(rows: int, w: NVFP4W4A16Weight) -> Config:
    return get_config(rows, w.n, w.k, sm_count=sm_count(w.device))


# All host checks live here: a clear TypeError / ValueError naming the argument, nothing corrupted.


def _check_prepare_inputs(packed, scales, alpha) -> tuple[int, int, torch.Tensor]:
    if not isinstance(packed, torch.Tensor) or packed.dtype not in (torch.uint8, torch.int8):
        raise TypeError(f"packed must be a uint8 or int8 tensor of packed E2M1 codes, got {_describe(packed)}")
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(
            "scales must be torch.float8_e4m3fn or uint8 UE4M3 bytes (convert float scales with "
            f".to(torch.float8_e4m3fn) after checking they fit E4M3's +-{E4M3_MAX:g}), got {_describe(scales)}"
        )
    if packed.dim() != 2:
        raise ValueError(f"packed must be 2-D [N, K/2], got shape {tuple(packed.shape)}")
    n, k = packed.shape[0], packed.shape[1] * 2
    if n % 128 or k % 256 or n == 0 or k == 0:
        raise ValueError(f"packed [N, K/2] needs N % 128 == 0 and K % 256 == 0, got N={n}, K={k}")
    if n * k // 2 >= MAX_OPERAND_BYTES:
        raise ValueError(f"packed must be under 4 GiB (32-bit offsets), got N={n}, K={k}")
    if tuple(scales.shape) != (n, k // SCALE_BLOCK):
        raise ValueError(f"scales must have shape [N, K/16] = {(n, k // SCALE_BLOCK)}, got {tuple(scales.shape)}")
    if scales.device != packed.device:
        raise ValueError(f"scales must be on packed's device {packed.device}, got {scales.device}")
    raw = scales.view(torch.uint8)
    if bool(((raw & 0x7F) == E4M3_NAN_MAGNITUDE).any()):
        raise ValueError("scales contain NaN (E4M3 0x7F / 0xFF)")
    if scales.dtype == torch.uint8 and bool((raw >= 0x80).any()):
        raise ValueError("scales: uint8 UE4M3 bytes must be below 0x80 (unsigned E4M3 has no sign bit)")
    if isinstance(alpha, (float, int)) and not isinstance(alpha, bool):
        alpha = torch.tensor([float(alpha)], dtype=torch.float32)
    if not isinstance(alpha, torch.Tensor) or alpha.dtype != torch.float32:
        raise TypeError(f"alpha must be a float or a float32 tensor, got {_describe(alpha)}")
    if alpha.numel() != 1 and tuple(alpha.shape) != (n,):
        raise ValueError(f"alpha must hold one value or have shape [N] = ({n},), got shape {tuple(alpha.shape)}")
    alpha = alpha.reshape(-1).to(packed.device)
    if not bool(torch.isfinite(alpha).all()):
        raise ValueError("alpha must be finite")
    return n, k, alpha


def check_linear_inputs(x, w, config, out, config_types=(FragConfig, TileConfig)) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(w, NVFP4W4A16Weight):
        raise TypeError(f"w must be an NVFP4W4A16Weight from prepare_nvfp4_weight, got {type(w).__name__}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
        raise TypeError(f"x must be a bfloat16 tensor, got {_describe(x)}")
    if x.dim() != 2 or x.shape[1] != w.k:
        raise ValueError(f"x must have shape [M, K={w.k}], got {tuple(x.shape)}")
    if x.numel() * x.element_size() >= MAX_OPERAND_BYTES:
        raise ValueError(f"x must be under 4 GiB (32-bit offsets), got shape {tuple(x.shape)}")
    m = x.shape[0]
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
            raise TypeError(f"out must be a bfloat16 tensor, got {_describe(out)}")
        if tuple(out.shape) != (m, w.n):
            raise ValueError(f"out must have shape [M, N] = {(m, w.n)}, got {tuple(out.shape)}")
        if not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out must be contiguous and 16-byte aligned")
    if config is not None:
        check_config(config, w.n, w.k, config_types)
    if x.device != w.device or x.device.type != "cuda":
        raise ValueError(f"x must be on the weight's CUDA device, {w.device}; got {x.device}")
    if out is not None and out.device != x.device:
        raise ValueError(f"out must be on x's device {x.device}, got {out.device}")
    if not x.is_contiguous():
        x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()  # cp.async moves 16-byte pieces; a fresh allocation is aligned
    if out is None:
        out = torch.empty((m, w.n), dtype=torch.bfloat16, device=x.device)
    return x, out


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


# ----------------------------------------------------------------------------------------------
# 6. Checking, timing and the command line
# ----------------------------------------------------------------------------------------------


def random_nvfp4_weight(n: int, k: int, device="cpu", generator: torch.Generator | None = None):
    """A random checkpoint weight: packed codes, float8_e4m3fn scales spread over 2^-6..2^6, alpha."""
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=generator).to(device)
    exponent = torch.randint(-6, 7, (n, k // SCALE_BLOCK), generator=generator).float()
    mantissa = 1 + torch.randint(0, 8, (n, k // SCALE_BLOCK), generator=generator).float() / 8
    scales = (mantissa * torch.exp2(exponent)).to(torch.float8_e4m3fn).to(device)
    return packed, scales, torch.tensor([0.01], dtype=torch.float32, device=device)


# DESIGN.md section 8: the bounds every GPU check applies against the FP32 reference.
MAX_REL_FROBENIUS = 2.5e-3
MAX_WORST_ROW_REL = 1e-2
ELEMENT_REL = 2.0**-8
ELEMENT_ROW_RMS = 1e-3


def compare_with_reference(y: torch.Tensor, ref: torch.Tensor) -> dict:
    """Errors of ``y`` against the FP32 reference and whether they meet the project's bounds."""
    y, ref = y.float(), ref.float()
    diff = y - ref
    row_rms = ref.pow(2).mean(dim=1, keepdim=True).sqrt()
    rel_frobenius = float(diff.norm() / ref.norm().clamp_min(1e-30))
    worst_row = float((diff.norm(dim=1) / ref.norm(dim=1).clamp_min(1e-30)).max())
    element_ok = bool((diff.abs() <= ELEMENT_REL * ref.abs() + ELEMENT_ROW_RMS * row_rms).all())
    finite = bool(torch.isfinite(y).all())
    ok = finite and element_ok and rel_frobenius <= MAX_REL_FROBENIUS and worst_row <= MAX_WORST_ROW_REL
    return {"ok": ok, "rel_frobenius": rel_frobenius, "worst_row": worst_row, "elementwise": element_ok, "finite": finite}


def verify(m: int, n: int, k: int, config: Config | None = None, seed: int = 0, linear=None) -> dict:
    """Fresh random inputs, a poisoned ``out``, the FP32 reference, and a repeat for bit-identity.
    ``linear`` is the function checked (default: this module's ``nvfp4_w4a16_linear``; maint passes its own)."""
    linear = linear or nvfp4_w4a16_linear
    g = torch.Generator().manual_seed(seed)
    packed, scales, alpha = random_nvfp4_weight(n, k, "cuda", g)
    w = prepare_nvfp4_weight(packed, scales, alpha)
    x = torch.randn(m, k, generator=g).to("cuda", torch.bfloat16)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    y = linear(x, w, config, out=out).clone()
    again = linear(x, w, config)
    result = compare_with_reference(y, reference_nvfp4_linear(x, packed, scales, alpha))
    result["deterministic"] = bool(torch.equal(y, again))
    result["ok"] = result["ok"] and result["deterministic"]
    return result


def graph_replays_match_eager(fn, x: torch.Tensor, replays: int = 2) -> bool:
    """Capture ``fn(x)`` in a CUDA graph (after one eager call, which compiles), then refill ``x`` with
    fresh values ``replays`` times: True when every replay equals an eager call bit for bit."""
    fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fn(x)
    for _ in range(replays):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(y, fn(x)):
            return False
    return True


TIMING_ATTEMPTS = 3  # measurements ``GraphTimer.per_call_us`` takes before refusing a negative time


class GraphTimer:
    """Microseconds per call from CUDA-graph replay: ``calls`` (each rotating over its own weight
    copy, so weights come from HBM) are captured once, each followed by ``separator`` when given;
    the separators' own cost, measured in a graph of separators alone, is subtracted."""

    def __init__(self, calls, separator=None):
        for call in calls:  # compile and warm up outside the capture
            call()
        torch.cuda.synchronize()
        # A graph holds its tensors' addresses, not the tensors: the calls (and the x, weights and
        # outputs they close over) live as long as the timer, however the caller drops its own.
        self.captured_calls = (calls, separator)
        self.calls = len(calls)
        self.graph = self._capture([c for call in calls for c in (call, separator) if c is not None])
        self.separators = self._capture([separator] * len(calls)) if separator is not None else None

    @staticmethod
    def _capture(fns):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
        graph.replay()
        return graph

    @staticmethod
    def _replay_us(graph, repeats: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000 / repeats

    def per_call_us(self, repeats: int = 5, heat_ms: float = 0.0) -> float:
        """``heat_ms``: first replay, untimed, for about that long, so that the timed replays run at
        the clocks a sustained load gets rather than those of a GPU that was idle a moment before.

        A measurement whose separators took as long as the calls with them is measured again, up to
        ``TIMING_ATTEMPTS`` times, then refused (``RuntimeError``): the fastest round of a benchmark
        would otherwise pick it (H200, 2026-12-01, run l: -8.19 us for the read kernel at 34816x5120
        M = 768, right after the M = 768 GEMMs; its other rounds 24.84 and 25.47 us)."""
        if heat_ms > 0:
            for _ in range(math.ceil(heat_ms * 1000 / self._replay_us(self.graph, 1))):
                self.graph.replay()
        for _ in range(TIMING_ATTEMPTS):
            total = self._replay_us(self.graph, repeats)
            if self.separators is not None:
                total -= self._replay_us(self.separators, repeats)
            if total > 0:
                return total / self.calls
        raise RuntimeError(f"timing failed {TIMING_ATTEMPTS} times: the separators took as long as the {self.calls} calls with them")


def time_per_call(calls, repeats: int = 5) -> float:
    """Microseconds per call of ``calls`` replayed from one CUDA graph (no separator)."""
    return GraphTimer(calls).per_call_us(repeats)


ROTATION_BYTES = 512 * 1024**2  # rotate over at least this many weight bytes: several times any L2
HBM_BYTES_PER_S = 4.46e12  # H200 read bandwidth the floors are counted against


def marlin_linear_or_none(packed: torch.Tensor, scales: torch.Tensor, alpha: torch.Tensor):
    """vLLM's Marlin NVFP4 W4A16 kernel as ``f(x) -> y`` (None when vLLM does not import)."""
    try:
        from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as marlin
    except Exception:  # vLLM missing or built for another torch: Marlin is optional
        return None
    layer = torch.nn.Module()
    n, k = packed.shape[0], packed.shape[1] * 2
    layer.weight = torch.nn.Parameter(packed.view(torch.uint8), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scales.view(torch.float8_e4m3fn), requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(alpha.reshape(()).clone(), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = n, k
    layer.params_dtype = torch.bfloat16
    marlin.prepare_fp4_layer_for_marlin(layer)
    return lambda x: marlin.apply_fp4_marlin_linear(
        x, layer.weight, layer.weight_scale, layer.weight_global_scale, layer.workspace, n, k
    )


def bench(ms: list[int], n: int, k: int) -> list[dict]:
    """Ours, BF16 cuBLAS (F.linear) and, when vLLM imports, Marlin, each rotating over >= 512 MB."""
    copies = max(2, math.ceil(ROTATION_BYTES / (n * k * 9 // 16)))
    weights = [random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(i)) for i in range(copies)]
    ours = [prepare_nvfp4_weight(*w) for w in weights]
    marlins = [marlin_linear_or_none(*w) for w in weights]
    dense = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(max(2, math.ceil(ROTATION_BYTES / (n * k * 2))))]
    rows = []
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        row = {"m": m, "n": n, "k": k}
        row["ours_us"] = time_per_call([lambda w=w: nvfp4_w4a16_linear(x, w) for w in ours])
        row["cublas_us"] = time_per_call([lambda d=d: torch.nn.functional.linear(x, d) for d in dense])
        if marlins[0] is not None:
            row["marlin_us"] = time_per_call([lambda f=f: f(x) for f in marlins])
        row["ours_weight_tb_s"] = n * k * WEIGHT_BYTES_PER_CODE / (row["ours_us"] * 1e-6) / 1e12
        rows.append(row)
        print(
            f"M={m:5d} {n}x{k}: ours {row['ours_us']:8.1f} us  cuBLAS {row['cublas_us']:8.1f} us  "
            + (f"Marlin {row['marlin_us']:8.1f} us  " if "marlin_us" in row else "Marlin n/a  ")
            + f"weights at {row['ours_weight_tb_s']:.2f} TB/s ({row['ours_weight_tb_s'] * 1e12 / HBM_BYTES_PER_S:.0%} of 4.46)",
            flush=True,
        )
    return rows


def compile_only(shapes: list[tuple[int, int]], ms: list[int], arch: str) -> None:
    """No GPU: check the layout on the CPU, and lower and compile the heuristic's kernels for ``arch``."""
    weight = random_nvfp4_weight(256, 512, generator=torch.Generator().manual_seed(0))
    exact = torch.equal(emulate_register_dequant(prepare_nvfp4_weight(*weight)), dequantize_nvfp4(*weight))
    print(f"layout: the register-dequant emulation {'matches' if exact else 'DIFFERS FROM'} the reference decode bit for bit")
    if not exact:
        raise SystemExit(1)
    for n, k in shapes:
        for config in sorted({get_config(m, n, k) for m in ms}, key=str):
            compile_kernel(n, k, config, arch)
            print(f"compiled for {arch}: N={n} K={k} {config} ({config.kernel_shape().shared_bytes()} B shared)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 300, 1024], help="rows of x")
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 5120], help="output features (paired with --k)")
    parser.add_argument("--k", type=int, nargs="+", default=[4096, 6144], help="input features (paired with --n)")
    parser.add_argument("--verify", action="store_true", help="check against the FP32 reference")
    parser.add_argument("--bench", action="store_true", help="time against cuBLAS BF16 (and Marlin if vLLM imports)")
    parser.add_argument("--arch", help="compile only, for this arch (e.g. sm_120, sm_90); the default without a GPU is sm_120")
    args = parser.parse_args(argv)
    if len(args.n) != len(args.k):
        parser.error("--n and --k take the same number of values")
    shapes = list(zip(args.n, args.k))
    if args.arch or not torch.cuda.is_available():
        if not torch.cuda.is_available():
            print("No CUDA GPU here: compiling the kernels and checking the layout on the CPU instead.")
        compile_only(shapes, args.m, args.arch or "sm_120")
        return 0
    failed = False
    if args.verify or not args.bench:
        print(f"{'M':>5} {'N':>6} {'K':>6}  {'config':<70} {'rel_frob':>9} {'worst_row':>9}  result")
        for n, k in shapes:
            for m in args.m:
                r = verify(m, n, k)
                config = get_config(min(m, MAX_M_PER_LAUNCH), n, k, sm_count=sm_count(torch.device("cuda", torch.cuda.current_device())))
                print(f"{m:5d} {n:6d} {k:6d}  {str(config):<70} {r['rel_frobenius']:9.2e} {r['worst_row']:9.2e}  {'ok' if r['ok'] else 'FAIL ' + str(r)}")
                failed |= not r["ok"]
    if args.bench:
        for n, k in shapes:
            bench(args.m, n, k)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
