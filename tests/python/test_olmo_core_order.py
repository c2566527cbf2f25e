"""olmoc's default data order (data.order: olmo_core) against OLMo-core itself.

The reference is computed at test time from the venv's numpy and olmo_core:
numpy's SeedSequence / PCG64 / Generator.shuffle for the generator olmoc
reimplements in src/data/np_random.c, and OLMo-core's NumpyFSLDataset +
NumpyFSLDataLoader (one loader per data-parallel rank, epochs 1, 2, ...) for
the batches every rank gets.  olmoc's side is tests/c/order_tool (the loader
of a training run, olmo_loader_open_run) and `olmoc train --dump-batches`.
"""
import json
import os
import shutil
import subprocess

from pathlib import Path

import numpy as np
import pytest
import torch

import olmo_core.data as olmo_data  # the reference: a missing olmo_core fails, it is not skipped
from olmo_core.data.utils import split_batch

VOCAB = 50000


def tool(build_dir):
    return build_dir / "tests" / "order_tool"


def run_tool(build_dir, *args):
    r = subprocess.run([str(tool(build_dir)), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


# ------------------------------------------------------------ numpy's generator

@pytest.mark.parametrize("seed", [0, 1, 34521, 34522, 2**32 - 1, 2**32, 2**63 + 12345, 2**64 - 1])
def test_seed_sequence_and_pcg64_match_numpy(build_dir, seed):
    words = [int(v) for v in run_tool(build_dir, "seedseq", seed).split()]
    assert words == [int(v) for v in np.random.SeedSequence(seed).generate_state(4, np.uint64)]
    raw = [int(v) for v in run_tool(build_dir, "raw", seed, 1000).split()]
    assert raw == [int(v) for v in np.random.PCG64(seed).random_raw(1000)]


@pytest.mark.parametrize("seed,n", [(1, 1), (1, 2), (34522, 3), (7, 1000), (35, 65537), (2**40 + 3, 300000)])
def test_shuffle_matches_numpy(build_dir, seed, n):
    ours = np.array(run_tool(build_dir, "shuffle", seed, n).split(), dtype=np.int64)
    ref = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed)).shuffle(ref)  # what OLMo-core's get_rng(seed).shuffle does
    assert np.array_equal(ours, ref)


# ------------------------------------------------------- OLMo-core's data loader

def make_files(root, sizes, dtype):
    rng = np.random.default_rng(sum(sizes))
    paths = []
    for i, n in enumerate(sizes):
        p = root / f"part{i}.{np.dtype(dtype).name}"
        rng.integers(0, VOCAB, n, dtype=dtype).tofile(p)  # raw memmaps, as OLMo-core and dolma write them
        paths.append(p)
    return paths


def olmo_core_rank_batches(paths, dtype, seq_len, batch_instances, world, seed, epochs, work, ds=None):
    """{rank: [rank batch (instances x seq_len) for every batch of epochs 1..epochs]}"""
    if ds is None:
        ds = olmo_data.NumpyFSLDataset(*paths, sequence_length=seq_len, pad_token_id=1, eos_token_id=0,
                                       vocab_size=VOCAB, dtype=dtype)
    ds.work_dir = work
    out = {}
    for rank in range(world):
        dl = olmo_data.NumpyDataLoaderBase.wrap_numpy_dataset(
            ds, global_batch_size=batch_instances * seq_len, collator=olmo_data.DataCollator(pad_token_id=1),
            work_dir=work, seed=seed, dp_world_size=world, dp_rank=rank, num_threads=1)
        out[rank] = []
        for epoch in range(1, epochs + 1):
            dl.reshuffle(epoch=epoch, in_memory=True)
            out[rank] += [b["input_ids"].numpy() for b in dl]
            dl.reset()
    return out, len(ds)


def olmoc_batches(build_dir, paths, dtype, seq_len, micro, accum, world, seed, n_batches, out, *extra):
    data = ["--set", f"data.mix={'+'.join(map(str, paths))}"] if paths else []
    state = run_tool(build_dir, "batches", out, world, n_batches, *data, "--set", f"model.vocab_size={VOCAB}", *extra,
                     "--set", f"data.dtype={np.dtype(dtype).name}",
                     "--set", f"train.seq_len={seq_len}", "--set", f"train.micro_batch={micro}",
                     "--set", f"train.grad_accum={accum}", "--set", f"train.seed={seed}")
    rows = np.fromfile(out, dtype=np.int32)
    return rows.reshape(n_batches, world, micro * accum, seq_len), [int(v) for v in state.split()]


CASES = [
    # (file sizes in tokens, dtype, seq_len, micro_batch, grad_accum, ranks, seed)
    ([50000], np.uint16, 64, 2, 3, 1, 0),
    ([50000], np.uint16, 64, 2, 3, 1, 34521),
    ([40000, 7777, 12345], np.uint16, 32, 1, 4, 2, 34521),
    ([40000, 7777, 12345], np.uint16, 32, 2, 1, 4, 0),
    ([9000, 31, 20011], np.uint32, 16, 3, 2, 2, 12345),
    ([65536 * 3 + 5], np.uint32, 128, 1, 1, 8, 2**40 + 17),
]


@pytest.mark.parametrize("sizes,dtype,seq_len,micro,accum,world,seed", CASES)
def test_every_rank_gets_olmo_core_instances(build_dir, tmp_path, sizes, dtype, seq_len, micro, accum, world, seed):
    paths = make_files(tmp_path, sizes, dtype)
    epochs = 3
    ref, n_instances = olmo_core_rank_batches(paths, dtype, seq_len, micro * accum * world, world, seed, epochs,
                                              tmp_path)
    per_epoch = n_instances // (micro * accum * world)
    n = per_epoch * epochs
    assert all(len(ref[r]) == n for r in range(world))
    ours, state = olmoc_batches(build_dir, paths, dtype, seq_len, micro, accum, world, seed, n, tmp_path / "o.bin")
    for r in range(world):
        for b in range(n):
            assert np.array_equal(ours[b, r], ref[r][b]), f"rank {r}, batch {b} (epoch {b // per_epoch + 1})"
            # a rank's micro-batches: consecutive pieces of its rows, as OLMo-core's split_batch cuts them
            ref_micro = split_batch({"input_ids": torch.from_numpy(ref[r][b])}, micro)
            for a in range(accum):
                assert np.array_equal(ours[b, r, a * micro:(a + 1) * micro], ref_micro[a]["input_ids"].numpy())
    # the loader ends at the end of the last full batch of epoch `epochs`
    assert state == [epochs - 1, per_epoch * micro * accum * world, per_epoch * micro * accum * world]


CHUNKED = [
    # (file sizes in tokens, dtype, seq_len, max_target_sequence_length, micro_batch, grad_accum, ranks, seed)
    ([50000], np.uint16, 32, 128, 2, 3, 1, 0),
    ([40000, 7777, 12345], np.uint16, 32, 256, 1, 4, 2, 34521),
    ([9000, 515, 20011], np.uint32, 16, 64, 3, 2, 2, 12345),
    ([65536 * 3 + 400], np.uint32, 64, 512, 2, 1, 4, 2**40 + 17),
]


@pytest.mark.parametrize("sizes,dtype,seq_len,max_target,micro,accum,world,seed", CHUNKED)
def test_max_target_sequence_length_chunks(build_dir, tmp_path, sizes, dtype, seq_len, max_target, micro, accum,
                                           world, seed):
    """data.max_target_sequence_length: OLMo-core's NumpyFSLDataset(max_target_sequence_length=...) with the
    data loader's chunk_size (wrap_numpy_dataset): whole chunks per file, shuffled as chunks."""
    paths = make_files(tmp_path, sizes, dtype)
    ds = olmo_data.NumpyFSLDataset(*paths, sequence_length=seq_len, max_target_sequence_length=max_target,
                                   pad_token_id=1, eos_token_id=0, vocab_size=VOCAB, dtype=dtype)
    epochs = 2
    ref, n_instances = olmo_core_rank_batches(None, None, seq_len, micro * accum * world, world, seed, epochs,
                                              tmp_path, ds=ds)
    assert n_instances < sum(s // seq_len for s in sizes)  # the chunking drops instances: the case is not trivial
    n = n_instances // (micro * accum * world) * epochs
    ours, _ = olmoc_batches(build_dir, paths, dtype, seq_len, micro, accum, world, seed, n, tmp_path / "o.bin",
                            "--set", f"data.max_target_sequence_length={max_target}")
    for r in range(world):
        assert len(ref[r]) == n
        for b in range(n):
            assert np.array_equal(ours[b, r], ref[r][b]), f"rank {r}, batch {b}"
    # without the option the order differs (so this test would see a loader that ignores it)
    plain, _ = olmoc_batches(build_dir, paths, dtype, seq_len, micro, accum, world, seed, n, tmp_path / "p.bin")
    assert not np.array_equal(plain, ours)


def test_max_target_sequence_length_refused(build_dir, tmp_path):
    paths = make_files(tmp_path, [5000], np.uint16)
    base = [str(tool(build_dir)), "batches", tmp_path / "o.bin", 1, 1, "--set", f"data.mix={paths[0]}",
            "--set", f"model.vocab_size={VOCAB}", "--set", "train.seq_len=64"]
    for extra, msg in [(["--set", "data.max_target_sequence_length=100"], "multiple of train.seq_len"),
                       (["--set", "data.max_target_sequence_length=32"], "multiple of train.seq_len"),
                       (["--set", "data.max_target_sequence_length=128", "--set", "data.order=olmoc"],
                        "olmo_core data order"),
                       (["--set", "data.max_target_sequence_length=8192"], "fewer tokens than one chunk")]:
        r = subprocess.run([*map(str, base), *extra], capture_output=True, text=True)
        assert r.returncode != 0 and msg in r.stderr, (extra, r.stderr)


@pytest.mark.parametrize("resume_at", [1, 7, 13, 14, 20])
def test_resumed_loader_continues_olmo_core_order(build_dir, tmp_path, resume_at):
    paths = make_files(tmp_path, [30000, 2001], np.uint16)
    seq_len, micro, accum, world, seed = 64, 2, 2, 2, 34521  # 500 instances: 13 batches of 40 an epoch
    full, _ = olmoc_batches(build_dir, paths, np.uint16, seq_len, micro, accum, world, seed, 30, tmp_path / "a.bin")
    resumed, _ = olmoc_batches(build_dir, paths, np.uint16, seq_len, micro, accum, world, seed, 30,
                               tmp_path / "b.bin", "--resume-at", resume_at)
    assert np.array_equal(full, resumed)
    ref, _ = olmo_core_rank_batches(paths, np.uint16, seq_len, micro * accum * world, world, seed, 3, tmp_path)
    for r in range(world):
        assert all(np.array_equal(full[b, r], ref[r][b]) for b in range(30))


def test_olmo3_stage1_mix_file(build_dir, tmp_path):
    """data.mix_file with OLMo-core's own OLMo-mix-0625-official.txt (the Olmo 3 7B Stage 1 mix, 1016
    files): small stand-in files at every listed path; the dataset OLMo-core's
    NumpyFSLDatasetConfig.from_data_mix builds from it and olmoc's loader give every rank the same batches."""
    import importlib.resources

    mix_txt = importlib.resources.files("olmo_core").joinpath("data/mixes/OLMo-mix-0625-official.txt")
    tokenizer = olmo_data.TokenizerConfig.dolma2()
    base = tmp_path / "mix"
    paths, _ = olmo_data.DataMix.OLMo_mix_0625_official.build(str(base), tokenizer.identifier)
    rng = np.random.default_rng(3)
    for p in paths:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        rng.integers(0, tokenizer.vocab_size, int(rng.integers(5, 120)), dtype=np.uint32).tofile(p)
    seq_len, micro, accum, world, seed = 16, 2, 2, 2, 34521
    ds = olmo_data.NumpyFSLDatasetConfig.from_data_mix(
        olmo_data.DataMix.OLMo_mix_0625_official, tokenizer=tokenizer, mix_base_dir=str(base),
        sequence_length=seq_len, max_target_sequence_length=seq_len, work_dir=str(tmp_path / "work")).build()
    assert ds.dtype == np.uint32 and len(ds.paths) == 1016
    ref, n_instances = olmo_core_rank_batches(None, None, seq_len, micro * accum * world, world, seed, 2,
                                              tmp_path, ds=ds)
    n = n_instances // (micro * accum * world) * 2
    ours, _ = olmoc_batches(build_dir, None, np.uint32, seq_len, micro, accum, world, seed, n, tmp_path / "o.bin",
                            "--set", f"data.mix_file={mix_txt}", "--set", f"data.mix_base_dir={base}",
                            "--set", "data.mix_tokenizer=allenai/dolma3-tokenizer",
                            "--set", f"model.vocab_size={tokenizer.padded_vocab_size()}")
    for r in range(world):
        assert len(ref[r]) == n
        for b in range(n):
            assert np.array_equal(ours[b, r], ref[r][b]), (r, b)


@pytest.mark.slow
def test_train_run_feeds_olmo_core_batches(build_dir, tmp_path):
    """End to end: the batches `olmoc train` trains on (its --dump-batches), one rank and, with
    mpirun, two ranks dealt OLMo-core's way."""
    from test_cli import TINY

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)  # seq_len 32, micro_batch 2, grad_accum 2
    rng = np.random.default_rng(5)
    data = tmp_path / "train.u16"
    rng.integers(0, 64, 32 * 50 + 7, dtype=np.uint16).tofile(data)  # 50 instances: 12 batches of 4 an epoch
    runs = [(1, 2)]
    if shutil.which("mpirun"):
        runs.append((2, 1))
    for world, accum in runs:
        out = tmp_path / f"run{world}"
        cmd = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.train_path={data}",
               "--set", f"data.out_dir={out}", "--set", "train.steps=30", "--set", "train.seed=34521",
               "--set", f"train.grad_accum={accum}", "--dump-batches", str(tmp_path / f"dump{world}.bin")]
        if world > 1:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(world), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        dump = np.fromfile(tmp_path / f"dump{world}.bin", dtype=np.int32).reshape(30, world, 2 * accum, 32)
        ref, _ = olmo_core_rank_batches([data], np.uint16, 32, 4, world, 34521, 3, tmp_path)
        for rank in range(world):
            for b in range(30):
                assert np.array_equal(dump[b, rank], ref[rank][b]), (world, rank, b)


def stage1_stand_ins(root, vocab, seed):
    """Small raw uint32 token files at every path of OLMo-core's OLMo-mix-0625-official.txt (the Olmo 3 7B
    Stage 1 mix), resolved as DataMix.build resolves them; returns the manifest, the tokenizer config."""
    import importlib.resources

    mix_txt = importlib.resources.files("olmo_core").joinpath("data/mixes/OLMo-mix-0625-official.txt")
    tokenizer = olmo_data.TokenizerConfig.dolma2()
    paths, _ = olmo_data.DataMix.OLMo_mix_0625_official.build(str(root), tokenizer.identifier)
    rng = np.random.default_rng(seed)
    for p in paths:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        rng.integers(0, vocab, int(rng.integers(5, 120)), dtype=np.uint32).tofile(p)
    return mix_txt, tokenizer


def test_train_on_olmo3_stage1_mix_file(build_dir, tmp_path):
    """End to end: `olmoc train` with data.mix_file, data.mix_base_dir and data.mix_tokenizer (the way
    --help, docs/data.md and configs/olmo3-7b.yaml give the Olmo 3 mixes) on OLMo-core's own Stage 1
    manifest trains on the batches OLMo-core's NumpyFSLDatasetConfig.from_data_mix dataset and its
    data loader give every rank, one rank and (with mpirun) two."""
    from test_cli import TINY

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)  # vocab 64, seq_len 32, micro_batch 2, grad_accum 2
    base = tmp_path / "mix"
    mix_txt, tokenizer = stage1_stand_ins(base, 64, 11)
    seq_len, steps, seed = 32, 12, 34521
    ds = olmo_data.NumpyFSLDatasetConfig.from_data_mix(
        olmo_data.DataMix.OLMo_mix_0625_official, tokenizer=tokenizer, mix_base_dir=str(base),
        sequence_length=seq_len, max_target_sequence_length=seq_len, work_dir=str(tmp_path / "work")).build()
    assert len(ds.paths) == 1016
    runs = [(1, 2)]
    if shutil.which("mpirun"):
        runs.append((2, 1))
    for world, accum in runs:
        out = tmp_path / f"run{world}"
        cmd = [str(build_dir / "olmoc"), "train", str(cfg), "--set", f"data.mix_file={mix_txt}",
               "--set", f"data.mix_base_dir={base}", "--set", "data.mix_tokenizer=allenai/dolma3-tokenizer",
               "--set", "data.dtype=uint32", "--set", f"data.out_dir={out}", "--set", f"train.steps={steps}",
               "--set", f"train.seed={seed}", "--set", f"train.grad_accum={accum}", "--set", "train.peak_flops=1e12",
               "--dump-batches", str(tmp_path / f"dump{world}.bin")]
        if world > 1:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(world), *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "OLMo-mix-0625-official.txt" in r.stdout  # the header names the data
        dump = np.fromfile(tmp_path / f"dump{world}.bin", dtype=np.int32).reshape(steps, world, 2 * accum, seq_len)
        ref, _ = olmo_core_rank_batches(None, None, seq_len, 4, world, seed, 1, tmp_path, ds=ds)
        for rank in range(world):
            for b in range(steps):
                assert np.array_equal(dump[b, rank], ref[rank][b]), (world, rank, b)
        losses = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        assert sum(x.get("type") == "train" for x in losses) >= 1


def test_weighted_mix_needs_olmoc_order(build_dir, tmp_path):
    paths = make_files(tmp_path, [5000, 5000], np.uint16)
    r = subprocess.run([str(tool(build_dir)), "batches", tmp_path / "x.bin", "1", "1",
                        "--set", f"data.mix={paths[0]}:0.7,{paths[1]}:0.3", "--set", "data.dtype=uint16",
                        "--set", f"model.vocab_size={VOCAB}", "--set", "train.seq_len=16"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "needs data.order: olmoc" in r.stderr, r.stderr
    r = subprocess.run([str(tool(build_dir)), "batches", tmp_path / "x.bin", "1", "1", "--set", "data.order=olmoc",
                        "--set", f"data.mix={paths[0]}:0.7,{paths[1]}:0.3", "--set", "data.dtype=uint16",
                        "--set", f"model.vocab_size={VOCAB}", "--set", "train.seq_len=16"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
