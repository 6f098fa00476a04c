"""CPU tests for the benchmark and the tuner: the parts that need no GPU (layer weighting, floors,
the report, the plot, candidate configs and how winners become table entries)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "maint" / "gemm" / "gemm_sm120"))

import benchmark_sm120_nvfp4_w4a16_gemm as bench  # noqa: E402
import tune_sm120_nvfp4_w4a16_gemm as tune  # noqa: E402

sk = tune.maint
nv = sk.example


def fake_result():
    cells = []
    for (n, k), layers in [((16384, 5120), 48), ((5120, 6144), 64)]:
        for m in (1, 256):
            rounds = {"ours": [10.0 + m, 9.0 + m, 11.0 + m], "marlin": [20.0, 21.0, 19.0 + m], "cublas": [30.0, 30.0, 30.0], "read": [6.0, 4.5, 5.0]}
            cells.append({"n": n, "k": k, "m": m, "layers": layers, "floor_us": bench.floor_us(m, n, k), "rounds": rounds})
    return {"meta": {"gpu": "test", "key": "sm_90-132sm", "dispatch": "tuned"}, "cells": cells}


def test_layer_weighted_totals_use_fastest_and_median_rounds():
    totals = bench.summarize(fake_result())
    assert totals[1]["fastest"]["ours"] == 48 * 10.0 + 64 * 10.0  # min of 11, 10, 12
    assert totals[1]["median"]["ours"] == 48 * 11.0 + 64 * 11.0
    assert totals[256]["fastest"]["marlin"] == 48 * 20.0 + 64 * 20.0
    assert totals[1]["floor"] == pytest.approx(48 * bench.floor_us(1, 16384, 5120) + 64 * bench.floor_us(1, 5120, 6144))


def test_floor_is_bandwidth_at_small_m_and_math_at_large_m():
    n, k = 16384, 5120
    assert bench.floor_us(1, n, k) == pytest.approx(n * k * 9 / 16 / 4.46e12 * 1e6)
    assert bench.floor_us(1024, n, k) == pytest.approx(2 * 1024 * n * k / 790e12 * 1e6)


def test_report_names_the_cells_we_lose(capsys):
    bench.print_report(fake_result())
    out = capsys.readouterr().out
    assert "cells where we lose: [(5120, 6144, 256), (16384, 5120, 256)]" in out  # worst ratio first


def test_report_gives_the_share_of_the_read_floor_we_reach(capsys):
    bench.print_report(fake_result())
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["1"], ["256"])}
    assert rows["1"][-1] == "0.45x"  # read 4.5 over ours 10 (fastest rounds; the same in both shapes)
    assert rows["256"][-1] == f"{4.5 / 265:.2f}x"


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_read_kernel_compiles_to_16_byte_loads(arch):
    source = bench.compile_read_kernel(1000, 8, arch).get_kernel_source()
    assert "int4" in source and "^" in source


@pytest.mark.skipif(not pytest.importorskip("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_read_kernel_reads_every_word_once():
    """The XOR of the sinks is the XOR of the buffer, with a tail that fills no whole pass."""
    import numpy as np
    import torch

    units, ctas = 3 * 8 * bench.READ_THREADS * bench.READ_UNROLL + 37, 8
    words = torch.randint(-(2**31), 2**31 - 1, (units * bench.READ_VECTOR,), dtype=torch.int32, device="cuda")
    sink = torch.empty(ctas * bench.READ_THREADS * bench.READ_VECTOR, dtype=torch.int32, device="cuda")
    bench.compile_read_kernel(units, ctas, nv.device_arch(words.device))(words, sink)
    got = np.bitwise_xor.reduce(sink.view(-1, bench.READ_VECTOR).cpu().numpy(), axis=0)
    assert (got == np.bitwise_xor.reduce(words.view(-1, bench.READ_VECTOR).cpu().numpy(), axis=0)).all()


def test_marlin_ratios_by_m_band():
    bands = bench.marlin_ratios_by_band(fake_result())
    # Fastest rounds: M = 1 is Marlin 20 / ours 10; M = 256 is Marlin 20 / ours 265 (bands 1-16 and 128-256).
    assert bands[(16384, 5120)] == {(1, 16): (2.0, 2.0), (128, 256): (20.0 / 265.0, 20.0 / 265.0)}
    assert set(bands) == {(16384, 5120), (5120, 6144)}


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plot.png"
    bench.plot(fake_result(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("m", [1, 16, 17, 33, 64, 96, 97, 512, 1024])
def test_tuner_candidates_fit(arch, m):
    for n, k in [(5120, 6144), (640, 2304), (34816, 5120)]:
        configs = tune.candidates(m, n, k, arch)
        assert configs and len(configs) == len(set(configs))
        assert sk.heuristic_config(m, n, k, arch=arch, sm_count=132) in configs  # the untuned dispatch is always timed
        kinds = {type(c) for c in configs}
        # Stream-K only over 48/64-row fragment tiles (the only place it won); wgmma only on sm_90.
        fragment_rows = nv.get_config(m, n, k).kernel_shape().block_m if m <= nv.FRAG_MAX_M else 0
        assert sk.StreamKConfig not in kinds or fragment_rows >= sk.STREAMK_MIN_BLOCK_M
        assert (sk.StreamKConfig in kinds) or fragment_rows < sk.STREAMK_MIN_BLOCK_M or n != 34816
        assert (sk.hopper.WgmmaConfig in kinds) == (arch == "sm_90")  # at every M
        deep_k = any(getattr(c, "block_k", 0) == tune.FRAG_DEEP_K for c in configs)
        assert deep_k == (fragment_rows == 16)  # every K here holds three 256-deep k tiles
        for c in configs:
            assert tune.fits(c, n, k, arch)


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_tuner_offers_narrow_fragment_tiles_where_tiles_are_fewer_than_sms(arch):
    """At M <= 16, 64-row weight tiles over every split where 128-row ones number fewer than the
    SMs (N = 5120: 40); not on 34816x5120 (272 tiles), nor above 16 rows."""
    for n, k, offered in [(5120, 17408, True), (5120, 6144, True), (34816, 5120, False)]:
        for m in (1, 16, 17):
            narrow = {c for c in tune.candidates(m, n, k, arch) if isinstance(c, nv.FragConfig) and c.block_n == tune.FRAG_NARROW_N}
            if offered and m <= 16:
                assert {c.split_k for c in narrow} == set(tune.FRAG_SPLITS)
            else:
                assert not narrow


def test_tuner_offers_tails_where_two_warpgroup_splits_leave_sms_idle():
    """On 5120x17408 at M = 32 (40 tiles): split 3 of two warpgroups leaves 12 SMs idle, so the tuner
    offers tails of 4 tiles a CTA, at the even length (10 of 136 k tiles) and two shorter; every one
    launches at most 132 CTAs and takes the marked exchange (that tails and splits run each (tile,
    k tile) once: ``test_tails_and_splits_cover_every_k_tile_once``). None where the tiles outnumber
    the SMs (34816x5120)."""
    wg = sk.hopper
    tails = [c for c in tune.candidates(32, 5120, 17408, "sm_90") if isinstance(c, wg.WgmmaConfig) and c.tail_k_tiles]
    split3 = {c for c in tails if c.split_k == 3 and c.block_x == 32}
    assert {(c.tail_k_tiles, c.tails_per_cta) for c in split3} == {(8, 4), (9, 4), (10, 4)}
    for c in tails:
        assert c.warpgroups == 2 and c.producer and c.split_plan.marked and c.tails_per_cta >= 2
        assert wg.wgmma_ctas(c, 32, 5120) <= 132
    assert not any(getattr(c, "tail_k_tiles", 0) for c in tune.candidates(32, 34816, 5120, "sm_90"))


def test_tuner_offers_fragment_tiles_that_fit_more_ctas_per_sm():
    """The heuristic's M = 1 tile (53 KB) leaves one CTA per sm_120 SM (100 KB) and four per H200 SM
    (228 KB), latency-bound at both; at M <= 16 the tuner also offers tiles of which more fit: two or
    more on sm_120, more than four on sm_90. Above M = 16 (where sm_90 fits two) it does not."""
    for n, k in [(34816, 5120), (5120, 6144)]:
        heuristic = nv.get_config(1, n, k)
        assert tune.ctas_per_sm(heuristic, "sm_120") == 1 and tune.ctas_per_sm(heuristic, "sm_90") == 4
        sm120 = [c for c in tune.candidates(1, n, k, "sm_120") if isinstance(c, nv.FragConfig)]
        assert any(tune.ctas_per_sm(c, "sm_120") >= 2 for c in sm120)
        sm90 = [c for c in tune.candidates(1, n, k, "sm_90") if isinstance(c, nv.FragConfig)]
        assert any(tune.ctas_per_sm(c, "sm_90") > 4 for c in sm90)
        above = [c for c in tune.candidates(32, n, k, "sm_90") if isinstance(c, nv.FragConfig)]
        assert not any((c.block_k, c.stages) in tune.FRAG_OCCUPANCY_SHAPES for c in above)


def test_configs_of_different_kinds_with_equal_fields_stay_apart():
    """A TileConfig and a StreamKConfig with the same seven numbers are equal as plain tuples; as
    configs they are not, so neither a set of candidates nor the table's merged ranges confuse them."""
    tile, streamk = nv.TileConfig(64, 128, 128, 1, 4, 4, 1), sk.StreamKConfig(64, 128, 128, 1, 4, 4, 1)
    assert tuple(tile) == tuple(streamk) and tile != streamk and len({tile, streamk}) == 2
    assert tile == nv.TileConfig(64, 128, 128, 1, 4, 4, 1) and hash(tile) == hash(nv.TileConfig(64, 128, 128, 1, 4, 4, 1))
    entries = tune.entries_from_winners(128, 256, [(1, tile, 9.0), (16, streamk, 9.0)])
    assert [(e["m_min"], e["m_max"], e["kind"]) for e in entries] == [(1, 1, "TileConfig"), (2, 1024, "StreamKConfig")]


def test_winners_become_merged_m_ranges():
    a, b = nv.FragConfig(16, 128, 128, 2, 4), sk.StreamKConfig()
    winners = [(1, a, 9.0), (4, a, 9.5), (16, b, 10.0), (64, a, 20.0)]
    entries = tune.entries_from_winners(128, 256, winners)
    assert [(e["m_min"], e["m_max"], e["kind"]) for e in entries] == [
        (1, 4, "FragConfig"), (5, 16, "StreamKConfig"), (17, 1024, "FragConfig"),
    ]  # fmt: skip
    assert sk.config_from_json(entries[1]) == b


def test_benchmark_precompiles_what_the_dispatch_launches(monkeypatch):
    """The benchmark compiles the cells' kernels up front: the configs it lists are the ones the
    tuned dispatch picks (the table's, else the heuristics'), one per 1024-row chunk size."""
    monkeypatch.setattr(nv, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(nv, "sm_count", lambda device: 132)
    monkeypatch.setattr(sk, "gpu_key", lambda device: "sm_90-132sm")
    cpu = pytest.importorskip("torch").device("cpu")
    n, k = next(iter(sk.load_table("sm_90-132sm")))
    for m in (1, 64, 300, 1024):
        assert bench.dispatched_configs(m, n, k, "tuned", cpu) == {sk.tuned_config(m, n, k, "sm_90-132sm")}
    assert bench.dispatched_configs(1100, n, k, "tuned", cpu) == {sk.tuned_config(r, n, k, "sm_90-132sm") for r in (1024, 76)}
    untuned = bench.dispatched_configs(300, 4096, 4096, "tuned", cpu)
    assert untuned == {sk.heuristic_config(300, 4096, 4096, arch="sm_90", sm_count=132)}
    assert bench.dispatched_configs(300, 4096, 4096, "example", cpu) == {nv.get_config(300, 4096, 4096, sm_count=132)}


def test_benchmark_race_rotates_methods_and_heats_each_timing_when_sustained():
    """``bench.race``: every method once per round, each round led by the next one; ``--sustained``
    passes its heat to every timing and the default passes none."""
    for heat in (0.0, bench.SUSTAINED_HEAT_MS):
        log = []

        class FakeTimer:
            def __init__(self, name):
                self.name = name

            def per_call_us(self, heat_ms=0.0):
                log.append((self.name, heat_ms))
                return float(len(log))

        times = bench.race({name: FakeTimer(name) for name in "abc"}, rounds=3, heat_ms=heat)
        assert [name for name, _ in log] == list("abc" "bca" "cab")
        assert {h for _, h in log} == {heat}
        assert times == {"a": [1.0, 6.0, 8.0], "b": [2.0, 4.0, 9.0], "c": [3.0, 5.0, 7.0]}


def test_tuner_first_pass_times_each_candidate_with_the_heat_it_is_given(monkeypatch):
    """``time_configs``: one timer per candidate, each timed once, after ``heat_ms`` (0 unless
    ``--sustained``), fastest first."""
    heats = []

    class FakeTimer:
        def __init__(self, config):
            self.config = config

        def per_call_us(self, heat_ms=0.0):
            heats.append(heat_ms)
            return 10.0 - self.config

    monkeypatch.setattr(tune, "graph_timer", lambda x, weights, config: FakeTimer(config))
    assert tune.time_configs(None, None, [1, 3, 2]) == [(7.0, 3), (8.0, 2), (9.0, 1)] and heats == [0.0] * 3
    heats.clear()
    tune.time_configs(None, None, [1, 3], bench.SUSTAINED_HEAT_MS)
    assert heats == [bench.SUSTAINED_HEAT_MS] * 2


def test_tuner_update_replaces_only_the_m_ranges_it_tuned():
    """``--update``: a tuned shape's old M ranges, cut at the breakpoints, take the winner of the
    breakpoint they end at, and keep their old config where they end at none; the new ones join an
    equal neighbour; other shapes stay as they were, and every shape keeps its place in the table."""
    a, b, c, d = (sk.config_to_json(nv.FragConfig(split_k=s)) for s in (1, 2, 4, 8))
    entry = lambda n, lo, hi, cfg: {"n": n, "k": 256, "m_min": lo, "m_max": hi, **cfg}  # noqa: E731
    old = [entry(128, 1, 16, a), entry(128, 17, 128, b), entry(128, 129, 1024, c), entry(256, 1, 1024, a)]
    other = entry(256, 1, 1024, a)
    tail = [entry(128, 1, 144, b), entry(128, 145, 1024, d)]  # what entries_from_winners gives for --ms 144,1024
    assert tune.update_entries(old, tail, [144, 1024]) == [entry(128, 1, 16, a), entry(128, 17, 144, b), entry(128, 145, 1024, d), other]
    head = [entry(128, 1, 4, d), entry(128, 5, 1024, b)]  # --ms 4,16: the last winner reaches 1024
    assert tune.update_entries(old, head, [4, 16]) == [entry(128, 1, 4, d), entry(128, 5, 128, b), entry(128, 129, 1024, c), other]
    assert tune.update_entries(old, head, [4, 8])[1:3] == [entry(128, 5, 8, b), entry(128, 9, 16, a)]
    every = tune.entries_from_winners(128, 256, [(16, nv.FragConfig(split_k=8), 1.0), (128, nv.FragConfig(split_k=8), 1.0), (1024, nv.FragConfig(split_k=2), 1.0)])
    assert tune.update_entries(old, every, [16, 128, 1024]) == [*every, other]  # every old boundary re-tuned: the shape is replaced
    assert tune.update_entries([other], tail, [144, 1024]) == [other, entry(128, 1, 144, b), entry(128, 145, 1024, d)]  # a new shape
    # A subset of the breakpoints leaves the ranges between them as they were (272 and 304 here).
    fine = [entry(128, 1, 256, a), entry(128, 257, 272, b), entry(128, 273, 304, c), entry(128, 305, 1024, a)]
    winners = [entry(128, 1, 1024, d)]  # --ms 256,384, one winner for both
    assert tune.update_entries(fine, winners, [256, 384]) == [
        entry(128, 1, 256, d), entry(128, 257, 272, b), entry(128, 273, 304, c), entry(128, 305, 384, d), entry(128, 385, 1024, a),
    ]  # fmt: skip


def test_tuner_final_race_rotates_the_order_and_keeps_each_configs_best_round(monkeypatch):
    """``final_race``: only the first pass's ``FINALISTS`` run again, all captured before the first
    round (as in the benchmark), each round starts with another of them, and each is ranked by its
    best round. Config c takes 10 + c us, plus 0.4 us per config run before it in the round (a GPU
    slowing under load); the first pass saw a stronger drift and ranked them backwards."""
    captured, replays = [], []

    class FakeTimer:
        def __init__(self, config):
            assert not replays, "every finalist is captured before the first round"
            captured.append(config)
            self.config = config

        def per_call_us(self, heat_ms=0.0):
            assert heat_ms == heat
            position = len(replays) % len(captured)
            replays.append(self.config)
            return 10.0 + 0.4 * position + self.config

    monkeypatch.setattr(tune, "graph_timer", lambda x, weights, config: FakeTimer(config))
    heat = bench.SUSTAINED_HEAT_MS  # --sustained: every timing of the race after its heat
    # First pass: config 3 timed first (13.0) looks faster than config 0 timed fourth (16.0).
    timed = [(13.0, 3), (14.5, 2), (15.0, 1), (16.0, 0), (17.0, 9)]
    final = tune.final_race(None, None, timed, heat)
    finalists = [3, 2, 1, 0][: tune.FINALISTS]
    assert captured == finalists
    orders = [replays[i : i + len(finalists)] for i in range(0, len(replays), len(finalists))]
    assert len(orders) == tune.FINAL_ROUNDS and all(sorted(o) == sorted(finalists) for o in orders)
    assert len({o[0] for o in orders}) == min(tune.FINAL_ROUNDS, len(finalists))  # a different config leads each round
    best = {c: min(10.0 + 0.4 * o.index(c) + c for o in orders) for c in finalists}
    assert final == sorted(((us, c) for c, us in best.items()), key=lambda t: t[0])
    assert final[0][1] == 0 and 9 not in [c for _, c in final]


def test_tuner_final_race_breaks_close_calls_with_more_rounds(monkeypatch):
    """Finalists within ``CLOSE_CALL`` of the fastest race again, ``TIEBREAK_ROUNDS`` rounds among
    themselves, and rank by that race ahead of the rest. Config 0 has one lucky round (10.00 us,
    then 10.60), config 1 runs 10.05 every time (within 1 %), config 2 11.0: the tie-break puts 1
    first."""
    replays = []

    class FakeTimer:
        def __init__(self, config):
            self.config = config

        def per_call_us(self, heat_ms=0.0):
            replays.append(self.config)
            if self.config == 0:
                return 10.0 if replays.count(0) == 1 else 10.6
            return {1: 10.05, 2: 11.0, 3: 12.0}[self.config]

    monkeypatch.setattr(tune, "graph_timer", lambda x, weights, config: FakeTimer(config))
    final = tune.final_race(None, None, [(9.0, 0), (9.1, 1), (9.2, 2), (9.3, 3)])
    first_rounds = tune.FINAL_ROUNDS * tune.FINALISTS
    assert sorted(replays[first_rounds:]) == sorted([0, 1] * tune.TIEBREAK_ROUNDS)  # only the close pair again
    assert final == [(10.05, 1), (10.6, 0), (11.0, 2), (12.0, 3)]


def test_tuner_final_race_does_not_believe_a_lucky_round(monkeypatch):
    """A config whose best round is more than ``LUCKY_ROUND`` under its median ranks by the median:
    config 0 runs 35.6 us but once 29.7 (the H200's 34816x5120 M = 16, 2026-12-01y), config 1 runs
    34.0 every time; 1 wins. Drift of a few per cent keeps the best round (config 2: 33.0, 34.0, 34.2)."""
    rounds = {0: iter([29.7, 35.6, 35.6]), 1: iter([34.0] * 3), 2: iter([34.2, 33.0, 34.0])}

    class FakeTimer:
        def __init__(self, config):
            self.config = config

        def per_call_us(self, heat_ms=0.0):
            return next(rounds[self.config])

    monkeypatch.setattr(tune, "graph_timer", lambda x, weights, config: FakeTimer(config))
    final = tune.final_race(None, None, [(30.0, 0), (34.0, 1), (34.1, 2)])
    assert final == [(33.0, 2), (34.0, 1), (35.6, 0)]
    assert tune.ranking_us([10.0, 10.4, 10.5]) == 10.0 and tune.ranking_us([8.0, 10.0, 10.0]) == 10.0


def test_tuner_twins_parse_and_keep_only_twins_that_apply(capsys):
    """``--twins FIELD=VALUE[,...]``: integers and booleans; a twin is the dispatch's config with those
    fields changed, left out where the config has no such field or the twin does not fit."""
    import argparse

    assert tune.parse_twin("block_k=128,stages=4") == {"block_k": 128, "stages": 4}
    assert tune.parse_twin("producer=True") == {"producer": True} and tune.parse_twin("tma_loads=false") == {"tma_loads": False}
    for bad in ("block_k", "block_k=deep", "=3", "block_k=128,"):
        with pytest.raises(argparse.ArgumentTypeError):
            tune.parse_twin(bad)
    wide = sk.hopper.WgmmaConfig(256, 64, 4, 1, True, 2)
    producer, deep = tune.parse_twin("producer=true"), tune.parse_twin("block_k=128,stages=3")
    assert tune.twin_configs(wide, [producer, deep], 16384, 5120, "sm_90") == [wide, wide._replace(producer=True), wide._replace(block_k=128, stages=3)]
    streamk = sk.WgmmaStreamKConfig(32, 64, 4, 2)  # one warpgroup, cp.async: a producer does not fit
    assert tune.twin_configs(streamk, [producer, tune.parse_twin("block_k=128")], 34816, 5120, "sm_90") == [streamk, streamk._replace(block_k=128)]
    fragment = nv.FragConfig(16, 128, 128, 4, 4)  # no such field
    assert tune.twin_configs(fragment, [producer, tune.parse_twin("split_k=8")], 34816, 5120, "sm_90") == [fragment, fragment._replace(split_k=8)]
    assert tune.twin_configs(streamk, [tune.parse_twin("ctas_per_sm=8")], 34816, 5120, "sm_90") == [streamk]  # does not fit
    with pytest.raises(SystemExit):  # a table from twins only as an update
        tune.main(["--twins", "producer=true", "--out", "table.json"])
    with pytest.raises(SystemExit):
        tune.main(["--twins", "producer=true", "--kinds", "SkinnyConfig", "--update"])
    assert "each choose the entrants" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not pytest.importorskip("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_tuner_writes_its_table_and_every_candidate_time(tmp_path):
    """A whole tuning run on one small shape: one timing row per candidate and M, and each table
    entry holds a config that was timed at its M (the fastest verified one)."""
    import torch

    arch = nv.device_arch(torch.device("cuda"))
    table, timings = tmp_path / "table.json", tmp_path / "timings.json"
    assert tune.main(["--shapes", "256x1024", "--ms", "1,64", "--out", str(table), "--timings", str(timings)]) == 0
    rows = json.loads(timings.read_text())["timings"]
    entries = json.loads(table.read_text())["entries"]
    for m in (1, 64):
        timed = [r for r in rows if r["m"] == m]
        assert len(timed) == len(tune.candidates(m, 256, 1024, arch)) and all(r["us"] > 0 for r in timed)
        (entry,) = [e for e in entries if e["m_min"] <= m <= e["m_max"]]
        assert {"kind": entry["kind"], "config": entry["config"]} in [{"kind": r["kind"], "config": r["config"]} for r in timed]


@pytest.mark.slow
@pytest.mark.skipif(not pytest.importorskip("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_tuner_twins_time_and_check_each_config(tmp_path, capsys):
    """``--twins``: per M one line and one verified row per config, the dispatch's first; no table."""
    import torch

    device = torch.device("cuda")
    timings = tmp_path / "timings.json"
    assert tune.main(["--shapes", "256x1024", "--ms", "64", "--twins", "stages=3", "--timings", str(timings)]) == 0
    rows = json.loads(timings.read_text())["timings"]
    base = sk.config_for(64, 256, 1024, device)
    assert sk.config_from_json(rows[0]) == base and all(r["ok"] and r["us"] > 0 for r in rows)
    assert len(rows) == len(tune.twin_configs(base, [{"stages": 3}], 256, 1024, nv.device_arch(device)))
    assert "256x1024 M=64: " in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(not pytest.importorskip("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_tuner_twins_update_races_only_the_twins(tmp_path):
    """``--twins ... --update``: a tuning whose entrants are the dispatch's config and its twins; the
    breakpoint's entry is the final race's fastest."""
    import torch

    device = torch.device("cuda")
    table, timings = tmp_path / "table.json", tmp_path / "timings.json"
    twins = [{"stages": 3}, {"stages": 5}]
    argv = ["--shapes", "256x1024", "--ms", "64", "--twins", "stages=3", "--twins", "stages=5", "--update", "--out", str(table), "--timings", str(timings)]
    assert tune.main(argv) == 0
    rows = json.loads(timings.read_text())["timings"]
    entrants = tune.twin_configs(sk.config_for(64, 256, 1024, device), twins, 256, 1024, nv.device_arch(device))
    assert sorted(map(repr, (sk.config_from_json(r) for r in rows))) == sorted(map(repr, entrants))
    fastest = min((r for r in rows if "final_us" in r), key=lambda r: r["final_us"])
    (entry,) = [e for e in json.loads(table.read_text())["entries"] if e["m_min"] <= 64 <= e["m_max"]]
    assert (entry["kind"], entry["config"]) == (fastest["kind"], fastest["config"])
