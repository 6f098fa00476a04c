"""Tests for examples/gemm_sm120/sm120_nvfp4_w4a16_gemm.py.

CPU tests (run everywhere): the register dequant emulated bit for bit at the PTX m16n8k16
B-fragment positions, input checks, config coverage, and compiling the kernels for sm_90 and sm_120.
GPU tests (skipped without a GPU): every result against the FP32 reference with the bounds of
DESIGN.md section 8, determinism, CUDA graphs.
"""

import pathlib
import re
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "gemm_sm120"))

import sm120_nvfp4_w4a16_gemm as nv  # noqa: E402

HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (sm_90 or newer)")

FINITE_E4M3_BYTES = [b for b in range(256) if b & 0x7F != nv.E4M3_NAN_MAGNITUDE]


def weight_with_scale_bytes(n, k, scale_bytes, seed=0):
    """Random codes and scales cycling through ``scale_bytes`` (raw E4M3 patterns)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    count = n * k // nv.SCALE_BLOCK
    order = torch.randperm(count, generator=g)
    raw = torch.tensor(scale_bytes, dtype=torch.uint8).repeat(count // len(scale_bytes) + 1)[:count][order]
    return packed, raw.reshape(n, k // nv.SCALE_BLOCK)


def per_column_alpha(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) + 0.5) * 2.0 ** torch.randint(-8, 3, (n,), generator=g).float()


# ---------------------------------------------------------------- CPU: the layout, bit for bit


def test_layout_bits_cover_each_word_once():
    bits = sorted(sum(nv.CODE_BIT_POSITIONS, []))
    assert bits == list(range(32))


def test_dequant_costs_nine_integer_ops_per_word():
    # One op per distinct non-zero rotation (its shifted word is shared) plus one AND/LOP3 per part.
    rotations = {rotation for parts in nv.REGISTER_PARTS for rotation, _ in parts if rotation}
    parts = sum(len(p) for p in nv.REGISTER_PARTS)
    assert len(rotations) + parts == 9
    # Rotations whose wrapped bits are masked off are emitted as plain shifts (IMAD.SHL, FMA pipe).
    source = nv.DEQUANT_SOURCE
    assert "(x << 4)" in source and "(x << 6)" in source and source.count("__funnelshift_l") == 2


@pytest.mark.parametrize("alpha_kind", ["scalar", "per_column"])
def test_register_dequant_exact_for_every_finite_e4m3_scale(alpha_kind):
    n, k = 256, 512  # 8192 scales: every finite E4M3 byte (zero, negative, subnormal) many times
    packed, raw = weight_with_scale_bytes(n, k, FINITE_E4M3_BYTES)
    scales = raw.view(torch.float8_e4m3fn)
    alpha = torch.tensor(0.375) if alpha_kind == "scalar" else per_column_alpha(n)
    w = nv.prepare_nvfp4_weight(packed, scales, alpha)
    emulated = nv.emulate_register_dequant(w)
    reference = nv.dequantize_nvfp4(packed, scales, alpha)
    assert torch.equal(emulated, reference)
    assert set(raw.unique().tolist()) == set(FINITE_E4M3_BYTES)


def test_register_dequant_exact_for_ue4m3_bytes_and_per_column_alpha():
    n, k = 128, 1024
    ue4m3 = [b for b in range(0x80) if b != nv.E4M3_NAN_MAGNITUDE]
    packed, raw = weight_with_scale_bytes(n, k, ue4m3, seed=1)
    alpha = per_column_alpha(n, seed=1)
    w = nv.prepare_nvfp4_weight(packed.view(torch.int8), raw, alpha)
    assert torch.equal(nv.emulate_register_dequant(w), nv.dequantize_nvfp4(packed, raw, alpha))
    same = nv.prepare_nvfp4_weight(packed, raw.view(torch.float8_e4m3fn), alpha)
    assert torch.equal(w.codes, same.codes) and torch.equal(w.scales, same.scales)


def test_one_code_lands_at_its_b_fragment_position():
    """A single nonzero code must come out at exactly its (n, k), nowhere else."""
    n, k = 128, 256
    scales = torch.full((n, k // 16), 1.0).to(torch.float8_e4m3fn)
    for row, col in [(0, 0), (1, 2), (37, 91), (127, 255), (64, 17)]:
        codes = torch.zeros(n, k, dtype=torch.uint8)
        codes[row, col] = 7  # 6.0
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
        dense = nv.emulate_register_dequant(nv.prepare_nvfp4_weight(packed, scales, 1.0))
        assert dense[row, col] == 6.0 and torch.count_nonzero(dense) == 1


def test_preparing_in_row_chunks_changes_nothing(monkeypatch):
    packed, raw = weight_with_scale_bytes(512, 256, FINITE_E4M3_BYTES, seed=5)
    whole = nv.prepare_nvfp4_weight(packed, raw.view(torch.float8_e4m3fn), 1.0)
    monkeypatch.setattr(nv, "PREPARE_ROWS_PER_CHUNK", 96)  # chunks that end mid-way in a 128-row tile
    chunked = nv.prepare_nvfp4_weight(packed, raw.view(torch.float8_e4m3fn), 1.0)
    assert torch.equal(whole.codes, chunked.codes) and torch.equal(whole.scales, chunked.scales)


def test_prepared_weight_is_the_checkpoint_size():
    n, k = 384, 768
    packed, scales, alpha = nv.random_nvfp4_weight(n, k)
    w = nv.prepare_nvfp4_weight(packed, scales, alpha)
    nbytes = w.codes.numel() * 4 + w.scales.numel() * 4
    assert nbytes == n * k // 2 + n * k // 16


def test_reference_decoders():
    assert nv.decode_e4m3(torch.tensor([0x38, 0x01, 0x7E, 0xB8, 0x80, 0x7F], dtype=torch.uint8)).tolist()[:5] == [
        1.0, 2.0**-9, 448.0, -1.0, -0.0,
    ]  # fmt: skip
    assert torch.isnan(nv.decode_e4m3(torch.tensor([0x7F, 0xFF], dtype=torch.uint8))).all()
    assert torch.isnan(nv.decode_ue4m3(torch.tensor([0x80], dtype=torch.uint8))).all()
    # float8_e4m3fn's own conversion agrees on every finite byte
    raw = torch.tensor(FINITE_E4M3_BYTES, dtype=torch.uint8)
    assert torch.equal(nv.decode_e4m3(raw), raw.view(torch.float8_e4m3fn).float())
    packed = torch.tensor([[0x71, 0xF8]], dtype=torch.uint8)
    assert nv.decode_e2m1(packed).tolist() == [[0.5, 6.0, -0.0, -6.0]]


# ---------------------------------------------------------------- CPU: input checks


def good_inputs(n=128, k=256):
    return nv.random_nvfp4_weight(n, k)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda p, s, a: (p.float(), s, a), TypeError, "packed"),
        (lambda p, s, a: (p.numpy(), s, a), TypeError, "packed"),
        (lambda p, s, a: (p, torch.full(s.shape, 1000.0), a), TypeError, "scales"),  # float32 above E4M3
        (lambda p, s, a: (p, s.float(), a), TypeError, "scales"),
        (lambda p, s, a: (p, s.float().bfloat16(), a), TypeError, "scales"),
        (lambda p, s, a: (p, s.view(torch.uint8).int(), a), TypeError, "scales"),
        (lambda p, s, a: (p[:64], s[:64], a), ValueError, "N % 128"),
        (lambda p, s, a: (p[:, :64], s[:, :8], a), ValueError, "K % 256"),
        (lambda p, s, a: (p.reshape(-1), s, a), ValueError, "2-D"),
        (lambda p, s, a: (p, s[:, :8], a), ValueError, "scales must have shape"),
        (lambda p, s, a: (p, nan_scales(s, 0x7F), a), ValueError, "NaN"),
        (lambda p, s, a: (p, nan_scales(s, 0xFF), a), ValueError, "NaN"),
        (lambda p, s, a: (p, nan_scales(s, 0x7F).view(torch.uint8), a), ValueError, "NaN"),
        (lambda p, s, a: (p, s.view(torch.uint8) | 0x80, a), ValueError, "0x80"),
        (lambda p, s, a: (p, s, a.double()), TypeError, "alpha"),
        (lambda p, s, a: (p, s, a.bfloat16()), TypeError, "alpha"),
        (lambda p, s, a: (p, s, "0.5"), TypeError, "alpha"),
        (lambda p, s, a: (p, s, torch.ones(7)), ValueError, "alpha"),
        (lambda p, s, a: (p, s, torch.tensor([float("inf")])), ValueError, "alpha"),
        (lambda p, s, a: (p, s, torch.tensor([float("nan")])), ValueError, "alpha"),
    ],
)
def test_prepare_rejects_bad_inputs(change, error, match):
    packed, scales, alpha = good_inputs()
    before = (packed.clone(), scales.view(torch.uint8).clone())
    with pytest.raises(error, match=match):
        nv.prepare_nvfp4_weight(*change(packed, scales, alpha))
    assert torch.equal(packed, before[0]) and torch.equal(scales.view(torch.uint8), before[1])  # nothing corrupted


def nan_scales(scales, byte):
    raw = scales.view(torch.uint8).clone()
    raw[3, 5] = byte
    return raw.view(torch.float8_e4m3fn)


def test_prepare_accepts_alpha_forms():
    packed, scales, _ = good_inputs()
    for alpha in (0.5, torch.tensor(0.5), torch.tensor([0.5]), torch.full((128,), 0.5)):
        w = nv.prepare_nvfp4_weight(packed, scales, alpha)
        assert torch.equal(w.alpha_x128, torch.full((128,), 64.0))


@pytest.fixture(scope="module")
def cpu_weight():
    return nv.prepare_nvfp4_weight(*good_inputs())


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(w="weight"), TypeError, "w must be"),
        (dict(x=[[1.0]]), TypeError, "x must be"),
        (dict(x=torch.zeros(4, 256)), TypeError, "x must be a bfloat16"),
        (dict(x=torch.zeros(4, 128, dtype=torch.bfloat16)), ValueError, "x must have shape"),
        (dict(x=torch.zeros(4, 2, 128, dtype=torch.bfloat16)), ValueError, "x must have shape"),
        (dict(out=torch.zeros(4, 128)), TypeError, "out must be"),
        (dict(out=torch.zeros(4, 256, dtype=torch.bfloat16)), ValueError, "out must have shape"),
        (dict(out=torch.zeros(128, 4, dtype=torch.bfloat16).T), ValueError, "contiguous"),
        (dict(out=torch.zeros(4 * 128 + 1, dtype=torch.bfloat16)[1:].view(4, 128)), ValueError, "aligned"),
        (dict(config=(16, 128, 128, 1, 4)), TypeError, "config"),
        (dict(config=nv.FragConfig(block_m=80)), ValueError, "block_m"),
        (dict(config=nv.FragConfig(block_n=256)), ValueError, "divide N"),
        (dict(config=nv.FragConfig(block_k=128, split_k=4)), ValueError, "divide K"),
        (dict(config=nv.FragConfig(block_k=128, warps_k=3)), ValueError, "warps_k"),
        (dict(config=nv.FragConfig(block_k=256, warps_k=8)), ValueError, "16 warps"),
        (dict(config=nv.TileConfig(block_m=256, block_k=128)), ValueError, "shared memory"),
        (dict(x=torch.zeros(4, 256, dtype=torch.bfloat16)), ValueError, "CUDA device"),
    ],
)
def test_linear_rejects_bad_inputs(cpu_weight, kwargs, error, match):
    args = dict(x=torch.zeros(4, 256, dtype=torch.bfloat16), w=cpu_weight, config=None, out=None)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        nv.nvfp4_w4a16_linear(**args)


# ---------------------------------------------------------------- CPU: configs


CONFIG_SHAPES = [
    (16384, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408),
    (4096, 4096), (640, 2304), (128, 256), (11008, 4096), (4096, 11008),
]  # fmt: skip


@pytest.mark.parametrize("n, k", CONFIG_SHAPES)
@pytest.mark.parametrize("sm_count", [132, 188])  # H200, RTX PRO 6000 Blackwell
def test_every_heuristic_config_fits(n, k, sm_count):
    seen = set()
    for m in range(1, nv.MAX_M_PER_LAUNCH + 1):
        config = nv.get_config(m, n, k, sm_count=sm_count)
        if config in seen:
            continue
        seen.add(config)
        nv.check_config(config, n, k)  # raises if it does not divide the shape or fit sm_120
        shape = config.kernel_shape()
        assert shape.shared_bytes() <= nv.SM120_SMEM_PER_CTA <= nv.SM120_SMEM_PER_SM
        assert n % shape.block_n == 0 and k % (shape.block_k * shape.split_k) == 0
        assert isinstance(config, nv.FragConfig) == (m <= nv.FRAG_MAX_M)


def test_split_k_fills_the_gpu_at_decode_sizes():
    config = nv.get_config(1, 5120, 6144, sm_count=132)
    assert config.split_k > 1 and 5120 // config.block_n * config.split_k >= 132


@pytest.mark.parametrize("n, k", CONFIG_SHAPES)
def test_split_k_partials_cost_less_than_the_weights(n, k):
    for m in range(1, nv.MAX_M_PER_LAUNCH + 1):
        split = nv.get_config(m, n, k, sm_count=132).kernel_shape().split_k
        if split > 1:
            assert 2 * split * m * n * 4 <= n * k * nv.WEIGHT_BYTES_PER_CODE


def test_uneven_16_row_tiles_split_until_they_spread():
    """16-row tiles that _split_k leaves unsplit but that load the SMs unevenly take the split that
    spreads them (nv.UNEVEN_MIN_IMBALANCE), while the partials stay small: on 132 SMs 11008x4096 (86
    tiles) and 34816x5120 (272) split 4 at M = 1-8 and stay unsplit at M = 16 (the H200 timings in the
    comment); 16384x5120 (128 tiles) spreads evenly over 132 SMs and not over 188."""
    for n, k in [(11008, 4096), (34816, 5120)]:
        assert [nv.get_config(m, n, k, sm_count=132).split_k for m in (1, 8, 16)] == [4, 4, 1]
    assert nv.get_config(1, 16384, 5120, sm_count=132).split_k == 1
    assert nv.get_config(1, 16384, 5120, sm_count=188).split_k == 4  # 512 CTAs: 3 on the busiest SM, 2.7 mean
    assert nv.get_config(17, 11008, 4096, sm_count=132).split_k == 1  # 32-row tiles keep _split_k's choice


def test_64_deep_k_tiles_where_128_cannot_split_enough():
    # K = 11008 = 128 * 86 = 128 * 2 * 43: 128-deep tiles split at most 2 ways (64 CTAs for N = 4096).
    config = nv.get_config(1, 4096, 11008, sm_count=132)
    assert config.block_k == 64 and 4096 // config.block_n * config.split_k >= 128
    assert nv.get_config(1, 4096, 4096, sm_count=132).block_k == 128  # 128-deep tiles fill the GPU there


# ---------------------------------------------------------------- CPU: compiling for both archs


COMPILE_CONFIGS = [
    nv.FragConfig(16, 128, 128, split_k=4, stages=4),
    nv.FragConfig(16, 128, 128, split_k=2, stages=3, warps_k=4),
    nv.TileConfig(128, 128, 64, 2, 2, split_k=1, stages=4),
]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("config", COMPILE_CONFIGS, ids=["fragment_splitk", "fragment_warps_k_splitk", "tile"])
def test_kernels_compile(arch, config):
    kernel = nv.compile_kernel(5120, 6144, config, arch)
    source = kernel.get_kernel_source()
    assert "mul.rn.bf16x2" in source and "mma_sync" in source and "cp_async" in source
    assert "setmaxnreg" not in source  # sm_120 has no setmaxnreg
    # the output tile leaves through shared memory as 16-byte row stores (OUT_ROW_PAD), none scattered
    assert "*(uint4*)(y + " in source and not re.findall(r"\by\[", source)


def kernel_body(source: str) -> str:
    """A kernel's CUDA source from its ``__global__`` function on (the imported helpers left out)."""
    return source[source.index("__global__") :]


@pytest.mark.parametrize("split_k", [4, 8])
def test_split_exchange_form_follows_the_loads_per_thread(split_k):
    """A 16-row fragment tile holds 16 accumulators (4 quadruples) per thread. At split 4 they are
    within EXCHANGE_BATCH_LOADS: the marked exchange, no fence, atomic or barrier of its own (TileLang
    puts one barrier before the reducer's staged store, which sits in a branch); its reducer takes
    the other 3 splits' pieces at once. At split 8 the ticket exchange: one acq_rel atomic
    (TileLang passes the memory order as an int, cuda::std::memory_order_acq_rel = 4), no fence,
    and one split's loads at a time."""
    config = COMPILE_CONFIGS[0]._replace(split_k=split_k)
    marked = nv.marked_exchange(split_k, config.kernel_shape().acc_size)
    assert marked == (split_k == 4)
    body = kernel_body(nv.compile_kernel(5120, 6144, config, "sm_90").get_kernel_source())
    assert "__threadfence" not in body
    if marked:
        unsplit = kernel_body(nv.compile_kernel(5120, 6144, config._replace(split_k=1), "sm_90").get_kernel_source())
        assert "Atomic" not in body and body.count("__syncthreads") <= unsplit.count("__syncthreads") + 1
        assert re.findall(r"nvfp4_(post|take)_partials<([\d, ]+)>", body) == [("post", "4"), ("take", "4, 3")]
    else:
        assert re.findall(r"AtomicAddRet\(\(&\(tickets\[[^]]*\]\)\), 1, (\d)\)", body) == ["4"]
        assert "#pragma unroll 1" in re.findall(r"(#pragma unroll(?: \d+)?)\s*\n\s*for \(int sk\b", body)
        assert "_partials<" not in body


def test_marked_partials_load_and_store_relaxed_at_gpu_scope():
    """The reducer sees a writer's piece once it lands in L2: relaxed GPU-scope accesses, not weak
    ones an L1 could answer; a value with the mark's bits goes as the canonical NaN."""
    helpers = nv.PARTIALS_SOURCE
    assert "ld.relaxed.gpu.global.v4.b32" in helpers and "st.relaxed.gpu.global.v4.b32" in helpers
    assert f"#define NVFP4_PARTIAL_MARK {nv.PARTIAL_MARK:#X}u".replace("0X", "0x") in helpers
    assert "0x7FFFFFFFu" in helpers


def test_split_k_buffers_hand_out_marked_partials_only_to_marked_exchanges(monkeypatch):
    """``SplitPlan.marked`` picks the partials: the device's marked workspace, grown to a power of
    two, or fresh memory the ticket exchange may leave as it likes (CPU tensors stand in); a plan
    that asks for tickets gets fresh memory where the marked exchange would fit; ``split_n`` sizes
    the partials for the split weight rows only."""
    monkeypatch.setattr(nv, "_WORKSPACES", {})
    monkeypatch.setattr(nv, "_OUTGROWN_WORKSPACES", [])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cpu = torch.device("cpu")
    w, x = types.SimpleNamespace(n=256, device=cpu), torch.zeros(3, 64)
    plan = nv.SplitPlan(4, 16, 16)
    assert nv.split_k_buffers(x, w, plan._replace(split_k=1))[0] is nv._WORKSPACES[cpu].no_partials
    marked, tickets = nv.split_k_buffers(x, w, plan)
    assert marked is nv._WORKSPACES[cpu].marked_partials and marked.numel() == 4 * 16 * 256
    assert tickets is nv._WORKSPACES[cpu].tickets
    for unmarked in (plan._replace(acc_size=64), plan._replace(tickets=True)):
        fresh, _ = nv.split_k_buffers(x, w, unmarked)
        assert fresh.numel() == 4 * 16 * 256 and fresh.data_ptr() != marked.data_ptr()
    assert nv.split_k_buffers(x, w, plan._replace(tickets=True), split_n=64)[0].numel() == 4 * 16 * 64
    assert not nv.marked_exchange(1, 16) and nv.marked_exchange(4, 16) and not nv.marked_exchange(8, 16)
    assert plan.marked and not plan._replace(tickets=True).marked


def test_parallel_precompile_runs_on_a_cpu_machine():
    """The GPU fixtures and the tuner rely on it; here it must work without a GPU."""
    nv.precompile({(384, 768, nv.FragConfig(16, 128, 128, split_k=2, stages=2))}, "sm_120")


# ---------------------------------------------------------------- GPU


def assert_ok(result):
    assert result["ok"], result


GPU_SHAPES = [(5120, 6144), (4096, 4096), (640, 2304), (128, 256)]
GPU_MS = [1, 17, 64, 200, 1024]
EXPLICIT_CONFIGS = [
    (40, nv.FragConfig(16, 128, 128, split_k=1, stages=4)),  # three 16-row passes
    (40, nv.FragConfig(16, 64, 64, split_k=8, stages=2)),
    (33, nv.FragConfig(48, 256, 64, split_k=2, stages=3)),
    (96, nv.FragConfig(64, 128, 64, split_k=4, stages=4)),
    (7, nv.FragConfig(32, 32, 256, split_k=8, stages=2)),
    (1, nv.FragConfig(16, 128, 128, split_k=1, stages=4, warps_k=4)),  # four k groups, reduced in shared memory
    (17, nv.FragConfig(32, 128, 128, split_k=2, stages=3, warps_k=2)),  # k groups and split-K together
    (70, nv.FragConfig(64, 128, 128, split_k=1, stages=2, warps_k=2)),
    (200, nv.TileConfig(64, 128, 64, 2, 2, split_k=4, stages=4)),
    (300, nv.TileConfig(128, 256, 64, 2, 4, split_k=1, stages=3)),
    (129, nv.TileConfig(128, 128, 64, 2, 2, split_k=2, stages=4)),
    (1024, nv.TileConfig(64, 64, 128, 1, 2, split_k=8, stages=2)),
]
SWEEP_SHAPES = [(16384, 5120), (5120, 17408), (11008, 4096), (640, 2304), (384, 768)]
SWEEP_M = [1, 2, 8, 16, 24, 32, 40, 64, 72, 96, 97, 128, 200, 256, 384, 640, 1024]


@pytest.fixture(scope="session", autouse=True)
def precompiled_kernels(request, precompiles):
    """Compile the GPU tests' kernels in parallel processes first: TileLang's disk cache then makes
    each in-test compile a load (minutes of nvcc become seconds). Correctness does not depend on it."""
    if not HAS_GPU or not precompiles:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    major, minor = torch.cuda.get_device_capability()
    cases = {(n, k, nv.get_config(m, n, k, sm_count=sms)) for n, k in GPU_SHAPES for m in GPU_MS}
    cases |= {(4096, 4096, config) for _, config in EXPLICIT_CONFIGS}
    cases |= {(4096, 4096, nv.get_config(m, 4096, 4096, sm_count=sms)) for m in (1, 17, 48, 76, 200, 1024)}
    cases |= {(1024, 2048, nv.get_config(m, 1024, 2048, sm_count=sms)) for m in (1, 64, 300)}
    if "not slow" not in (request.config.getoption("markexpr") or ""):
        cases |= {(n, k, nv.get_config(m, n, k, sm_count=sms)) for n, k in SWEEP_SHAPES for m in SWEEP_M}
    nv.precompile(cases, f"sm_{major}{minor}")


@needs_gpu
@pytest.mark.parametrize("n, k", GPU_SHAPES)
@pytest.mark.parametrize("m", [1, 17, 64, 200, 1024])
def test_matches_reference(m, n, k):
    assert_ok(nv.verify(m, n, k, seed=m + n))


@needs_gpu
@pytest.mark.parametrize("m, config", EXPLICIT_CONFIGS)
def test_explicit_configs(m, config):
    assert_ok(nv.verify(m, 4096, 4096, config=config, seed=m))


@needs_gpu
def test_zero_negative_subnormal_scales_with_per_column_alpha():
    n, k = 1024, 2048
    packed, raw = weight_with_scale_bytes(n, k, FINITE_E4M3_BYTES, seed=3)
    # Mostly ordinary scales so the output stays well conditioned, with every finite byte present.
    ordinary = nv.random_nvfp4_weight(n, k, generator=torch.Generator().manual_seed(3))[1].view(torch.uint8)
    keep = torch.rand(raw.shape, generator=torch.Generator().manual_seed(4)) < 0.1
    raw = torch.where(keep, raw, ordinary)
    scales, alpha = raw.view(torch.float8_e4m3fn).cuda(), per_column_alpha(n).cuda()
    packed = packed.cuda()
    w = nv.prepare_nvfp4_weight(packed, scales, alpha)
    for m in (1, 64, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert_ok(nv.compare_with_reference(nv.nvfp4_w4a16_linear(x, w), nv.reference_nvfp4_linear(x, packed, scales, alpha)))


@pytest.fixture(scope="module")
def gpu_case():
    n, k = 4096, 4096
    packed, scales, alpha = nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(7))
    return packed, scales, alpha, nv.prepare_nvfp4_weight(packed, scales, alpha)


@needs_gpu
def test_m_above_1024_runs_as_chunks(gpu_case):
    packed, scales, alpha, w = gpu_case
    x = torch.randn(1100, 4096, device="cuda", dtype=torch.bfloat16)
    y = nv.nvfp4_w4a16_linear(x, w)
    assert_ok(nv.compare_with_reference(y, nv.reference_nvfp4_linear(x, packed, scales, alpha)))
    assert torch.equal(y[1024:], nv.nvfp4_w4a16_linear(x[1024:], w))


@needs_gpu
def test_out_argument_and_misaligned_x(gpu_case):
    packed, scales, alpha, w = gpu_case
    m = 17
    storage = torch.randn(m * 4096 + 8, device="cuda", dtype=torch.bfloat16)
    x = storage[1 : 1 + m * 4096].view(m, 4096)
    assert x.data_ptr() % 16
    out = torch.full((m, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = nv.nvfp4_w4a16_linear(x, w, out=out)
    assert y is out
    assert_ok(nv.compare_with_reference(out, nv.reference_nvfp4_linear(x, packed, scales, alpha)))
    assert torch.equal(out, nv.nvfp4_w4a16_linear(x.clone(), w))
    with pytest.raises(ValueError, match="device"):
        nv.nvfp4_w4a16_linear(x, w, out=torch.empty(m, 4096, dtype=torch.bfloat16))


@needs_gpu
@pytest.mark.parametrize("m", [1, 48, 200])
def test_cuda_graph_replays_match_eager(gpu_case, m):
    _, _, _, w = gpu_case
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    assert nv.graph_replays_match_eager(lambda x: nv.nvfp4_w4a16_linear(x, w), x)


def _timer_with_replays(monkeypatch, replay_us):
    """A GraphTimer of 4 calls with separators whose replays take ``replay_us`` in turn (calls and
    separators alternating), without a GPU."""
    timer = object.__new__(nv.GraphTimer)
    timer.calls, timer.graph, timer.separators = 4, "calls", "separators"
    times = iter(replay_us)
    monkeypatch.setattr(nv.GraphTimer, "_replay_us", staticmethod(lambda graph, repeats: next(times)))
    return timer


def test_graph_timer_keeps_the_captured_tensors_alive(monkeypatch):
    """The caller may drop x and the weights once the timer exists: the graph still reads them."""
    import weakref

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(nv.GraphTimer, "_capture", staticmethod(lambda fns: "graph"))
    x = torch.zeros(4)
    alive = weakref.ref(x)
    timer = nv.GraphTimer([lambda x=x: x.add_(1.0)], lambda: None)
    del x
    assert alive() is not None and timer.calls == 1


def test_graph_timer_measures_again_when_separators_outlast_the_calls(monkeypatch):
    timer = _timer_with_replays(monkeypatch, [40.0, 48.0, 140.0, 40.0])  # first: -2 us per call
    assert timer.per_call_us() == 25.0


def test_graph_timer_refuses_a_timing_that_stays_negative(monkeypatch):
    timer = _timer_with_replays(monkeypatch, [40.0, 48.0] * nv.TIMING_ATTEMPTS)
    with pytest.raises(RuntimeError, match="timing failed"):
        timer.per_call_us()


@needs_gpu
def test_graph_timer_heat_replays_before_timing():
    """``per_call_us(heat_ms=...)`` replays the graph for about that long before the timed replays
    (the benchmark's ``--sustained``); without heat it replays only the timed ones."""
    counter = torch.zeros(1, device="cuda")
    timer = nv.GraphTimer([lambda: torch.cuda._sleep(100_000), lambda: counter.add_(1.0)])  # ~50 us of spinning per replay
    captured = counter.item()  # the warm-up call and the capture's replay
    assert timer.per_call_us(repeats=5) > 0
    assert counter.item() - captured == 5
    timer.per_call_us(repeats=5, heat_ms=5.0)
    heat_replays = counter.item() - captured - 5 - 5
    assert 5 <= heat_replays <= 1000, heat_replays


@needs_gpu
def test_first_call_inside_a_graph_sharing_a_pool():
    """The very first call for a weight happens inside a capture whose pool an earlier graph used."""
    n, k, m = 2048, 1024, 8
    packed, scales, alpha = nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(9))
    w = nv.prepare_nvfp4_weight(packed, scales, alpha)  # creates the device workspace
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    first = torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        scratch = torch.randn(1 << 20, device="cuda").sum()
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second, pool=first.pool()):
        y = nv.nvfp4_w4a16_linear(x, w)
    first.replay()
    second.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(scratch)
    assert_ok(nv.compare_with_reference(y, nv.reference_nvfp4_linear(x, packed, scales, alpha)))


def test_outgrown_workspace_stays_alive(monkeypatch):
    """A larger weight or launch replaces the device's workspace; the old one is kept for the graphs
    that were captured with it (CPU tensors stand in for the device's). Marked partials grow to a
    power of two, every word the mark."""
    monkeypatch.setattr(nv, "_WORKSPACES", {})
    monkeypatch.setattr(nv, "_OUTGROWN_WORKSPACES", [])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cpu = torch.device("cpu")
    small = nv._ensure_workspace(cpu, tickets=8)
    assert nv._ensure_workspace(cpu, tickets=8) is small and not nv._OUTGROWN_WORKSPACES
    large = nv._ensure_workspace(cpu, tickets=64)
    assert large.tickets.numel() == 64 and large.marked_partials.numel() == 0 and nv._OUTGROWN_WORKSPACES == [small]
    assert nv._ensure_workspace(cpu, tickets=16) is large
    marked = nv._ensure_workspace(cpu, marked_partials=100)
    assert marked.tickets.numel() == 64 and marked.marked_partials.numel() == 128 and marked.marked_partials.dtype == torch.float32
    assert (marked.marked_partials.view(torch.int32) == nv.PARTIAL_MARK - 2**32).all()
    assert nv._ensure_workspace(cpu, marked_partials=128) is marked and nv._OUTGROWN_WORKSPACES == [small, large]


@needs_gpu
def test_graph_captured_before_the_workspace_grew_still_matches_eager():
    """A split-K graph captured before a larger weight and a larger launch grew the workspace (tickets,
    then marked partials) replays correctly after it."""
    n, k, config = 512, 1024, nv.FragConfig(16, 128, 128, split_k=4, stages=2)
    assert nv.marked_exchange(4, config.kernel_shape().acc_size)
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, k, "cuda"))
    x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
    nv.nvfp4_w4a16_linear(x, w, config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nv.nvfp4_w4a16_linear(x, w, config)
    ws = nv._WORKSPACES[w.device]
    wide = (ws.tickets.numel() // (nv.MAX_M_PER_LAUNCH // 16) + 1) * nv.FRAG_N * 2  # needs more tickets
    wide = max(wide, ws.marked_partials.numel() // (4 * nv.MAX_M_PER_LAUNCH) + 1)  # and more partials
    wide = -(-wide // 128) * 128  # whole 128-row tiles
    big = torch.randn(nv.MAX_M_PER_LAUNCH, k, device="cuda", dtype=torch.bfloat16)
    nv.nvfp4_w4a16_linear(big, nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(wide, k, "cuda")), config)
    grown = nv._WORKSPACES[w.device]
    assert grown.tickets.numel() > ws.tickets.numel() and grown.marked_partials.numel() > ws.marked_partials.numel()
    padding = torch.full((ws.tickets.numel() + ws.marked_partials.numel(),), 7, dtype=torch.int32, device="cuda")  # what reused memory would hold
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, nv.nvfp4_w4a16_linear(x, w, config))
    del padding


@needs_gpu
def test_split_launches_leave_every_partial_marked():
    """Every word of the marked partials holds the mark between launches (a word left unmarked would
    pass for a piece in the next launch), whichever form the exchange takes, also where a NaN in x
    makes NaN pieces: nothing hangs, the NaN stays in its row."""
    w = nv.prepare_nvfp4_weight(*(raw := nv.random_nvfp4_weight(512, 2048, "cuda")))
    for m, config in [
        (1, nv.FragConfig(16, 128, 128, split_k=4, stages=2)),  # marked
        (13, nv.FragConfig(16, 128, 128, split_k=4, stages=2)),  # marked
        (13, nv.FragConfig(16, 128, 128, split_k=8, stages=2)),  # ticket
        (40, nv.TileConfig(64, 128, 64, 2, 2, split_k=4, stages=4)),  # ticket
    ]:
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        assert_ok(nv.compare_with_reference(nv.nvfp4_w4a16_linear(x, w, config), nv.reference_nvfp4_linear(x, *raw)))
        x[0, 5] = float("nan")
        y = nv.nvfp4_w4a16_linear(x, w, config)
        torch.cuda.synchronize()
        assert torch.isnan(y[0]).all() and torch.isfinite(y[1:]).all()
        assert (nv._WORKSPACES[w.device].marked_partials.view(torch.int32) == nv.PARTIAL_MARK - 2**32).all()


@needs_gpu
def test_capture_that_must_grow_the_marked_partials_raises():
    """A marked split-K launch inside a capture finds its partials already there or raises, the
    workspace unchanged: marking new ones would have to be part of the graph."""
    ws = nv._ensure_workspace(torch.device("cuda", torch.cuda.current_device()))
    n = (ws.marked_partials.numel() // (4 * nv.MAX_M_PER_LAUNCH * 128) + 1) * 128  # needs more than there is
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, 1024, "cuda"))
    ws = nv._WORKSPACES[w.device]
    config = nv.FragConfig(16, 128, 128, split_k=4, stages=2)
    x = torch.randn(nv.MAX_M_PER_LAUNCH, 1024, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="run each call to be captured once"):
        with torch.cuda.graph(graph):
            nv.nvfp4_w4a16_linear(x, w, config)
    assert nv._WORKSPACES[w.device] is ws


@needs_gpu
def test_capture_that_needs_a_new_workspace_raises():
    """The workspace is made by prepare_nvfp4_weight; a capture must never allocate it."""
    saved = dict(nv._WORKSPACES)
    try:
        packed, scales, alpha = nv.random_nvfp4_weight(128, 256, "cuda")
        w = nv.prepare_nvfp4_weight(packed, scales, alpha)
        x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        nv.nvfp4_w4a16_linear(x, w)
        nv._WORKSPACES.clear()  # as if the weight had been prepared somewhere else
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="workspace"):
            with torch.cuda.graph(graph):
                nv.nvfp4_w4a16_linear(x, w)
    finally:
        nv._WORKSPACES.clear()
        nv._WORKSPACES.update(saved)


@needs_gpu
@pytest.mark.slow
@pytest.mark.parametrize("n, k", SWEEP_SHAPES)
def test_sweep(n, k):
    failures = [(m, r) for m in SWEEP_M if not (r := nv.verify(m, n, k, seed=m))["ok"]]
    assert not failures, failures
