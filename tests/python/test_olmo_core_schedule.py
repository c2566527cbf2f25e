"""olmoc's learning-rate schedules against OLMo-core's scheduler objects.

The reference is computed at test time: olmo_core.optim.scheduler's
CosWithWarmup, HalfCosWithWarmup, LinearWithWarmup, WSD and ConstantScheduler
(get_lr(initial_lr, step, t_max) with OLMo-core's 1-based trainer.global_step),
and the schedule length of a Duration.tokens from OLMo-core's own
Trainer._get_max_steps.  olmoc's side is tests/c/sched_tool (olmo_lr_at_batch,
what the trainer calls).  Every step is compared for exact float64 equality.
"""
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from olmo_core.optim.scheduler import WSD, ConstantScheduler, CosWithWarmup, HalfCosWithWarmup, LinearWithWarmup
from olmo_core.train import Duration
from olmo_core.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def olmoc_lrs(build_dir, tmp_path, world, first, last, *sets, config=None):
    out = tmp_path / "lr.bin"
    args = [str(build_dir / "tests" / "sched_tool"), str(out), str(world), str(first), str(last)]
    if config:
        args += ["--config", str(config)]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.fromfile(out, dtype=np.float64), [int(v) for v in r.stdout.split()]


def trainer_max_steps(tokens, tokens_per_batch, global_step=0):
    """OLMo-core's Trainer.max_steps for max_duration=Duration.tokens(tokens), after global_step
    steps of tokens_per_batch tokens (the Trainer method itself, on a stand-in for its state)."""
    state = SimpleNamespace(global_step=global_step, global_train_tokens_seen=global_step * tokens_per_batch,
                            tokens_per_batch=tokens_per_batch)
    return Trainer._get_max_steps(state, Duration.tokens(tokens))


def reference(sched, lr, t_max, first, last):
    return np.array([sched.get_lr(lr, s, t_max) for s in range(first, last + 1)], dtype=np.float64)


def assert_same(ours, ref, first):
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, (f"{bad.size} of {ref.size} steps differ, first at step {first + bad[0]}: "
                           f"olmoc {ours[bad[0]]!r}, OLMo-core {ref[bad[0]]!r}")


SEQ, MICRO, ACCUM = 8, 2, 3  # sched_tool's seq_len, and 6 instances per rank and step

CASES = [
    # (olmoc --set, OLMo-core scheduler, t_max)
    (["train.schedule=cos_with_warmup", "train.warmup_steps=100", "train.steps=5000"],
     CosWithWarmup(warmup=100, alpha_f=0.1), 5000),
    (["train.schedule=cosine", "train.warmup_steps=2000", "train.alpha_f=0.05", "train.steps=9000",
      "train.schedule_steps=12345"], CosWithWarmup(warmup=2000, alpha_f=0.05), 12345),
    (["train.schedule=half_cos_with_warmup", "train.warmup_steps=300", "train.steps=4000"],
     HalfCosWithWarmup(warmup=300, alpha_f=0.1), 4000),
    (["train.schedule=half_cos_with_warmup", "train.warmup_steps=0", "train.alpha_f=0", "train.steps=777"],
     HalfCosWithWarmup(warmup=0, alpha_f=0.0), 777),
    (["train.schedule=linear_with_warmup", "train.warmup_steps=0", "train.alpha_f=0", "train.steps=3000"],
     LinearWithWarmup(warmup=0, alpha_f=0.0), 3000),
    (["train.schedule=linear", "train.warmup_steps=50", "train.steps=1000"],
     LinearWithWarmup(warmup=50, alpha_f=0.1), 1000),
    (["train.schedule=wsd", "train.warmup_steps=100", "train.steps=2345"],  # decay round(234.5) = 234
     WSD(warmup=100), 2345),
    (["train.schedule=wsd", "train.warmup_steps=10", "train.steps=3000", "train.decay_steps=500"],
     WSD(warmup=10, decay=500, decay_fraction=None), 3000),
    (["train.schedule=wsd", "train.warmup_steps=0", "train.steps=1000", "train.decay_fraction=0.25"],
     WSD(warmup=0, decay_fraction=0.25), 1000),
    (["train.schedule=constant", "train.steps=100"], ConstantScheduler(), 100),
]


@pytest.mark.parametrize("sets,sched,t_max", CASES, ids=[c[1].__class__.__name__ for c in CASES])
@pytest.mark.parametrize("lr", [3e-4, 2.0712352850360292e-4])
def test_scheduler_matches_olmo_core(build_dir, tmp_path, sets, sched, t_max, lr):
    last = t_max + 50  # and past the end
    ours, _ = olmoc_lrs(build_dir, tmp_path, 1, 1, last, f"train.lr={lr!r}", f"train.seq_len={SEQ}",
                        f"train.micro_batch={MICRO}", f"train.grad_accum={ACCUM}", *sets)
    assert_same(ours, reference(sched, lr, t_max, 1, last), 1)


@pytest.mark.parametrize("world,tokens", [(1, 10**6), (4, 123457), (3, 2 * 10**6 + 1), (2, 96 * 1000)])
@pytest.mark.parametrize("kind", ["cos_with_warmup", "wsd"])
def test_schedule_length_in_tokens_as_olmo_core_trainer(build_dir, tmp_path, world, tokens, kind):
    tokens_per_step = SEQ * MICRO * ACCUM * world
    t_max = trainer_max_steps(tokens, tokens_per_step)
    ours, lengths = olmoc_lrs(build_dir, tmp_path, world, 1, t_max + 5, f"train.schedule={kind}",
                              "train.warmup_steps=20", f"train.schedule_tokens={tokens}", f"train.seq_len={SEQ}",
                              f"train.micro_batch={MICRO}", f"train.grad_accum={ACCUM}", "train.steps=1")
    assert lengths[0] == t_max
    sched = CosWithWarmup(warmup=20) if kind == "cos_with_warmup" else WSD(warmup=20)
    assert_same(ours, reference(sched, 3e-4, t_max, 1, t_max + 5), 1)


@pytest.mark.slow
def test_olmo3_7b_stage1_schedule(build_dir, tmp_path):
    """configs/olmo3-7b.yaml against OLMo-core's objects as the official scripts configure them
    (src/scripts/official/OLMo3/OLMo-3-1025-7B-pretrain-1.py and -2.py), every step of the run."""
    lr, global_batch = 3e-4, 8192 * 512
    steps, resumed_at = 1413814, 596047  # one epoch; part 2 loaded the step 596047 checkpoint
    part1 = CosWithWarmup(warmup_steps=2000)
    t_max1 = trainer_max_steps(int(5e12), global_batch)
    original_max_steps = int(5e12) // global_batch
    part2 = HalfCosWithWarmup(warmup_steps=original_max_steps // 2 + 2000 // 2)
    t_max2 = trainer_max_steps(int(7e12), global_batch, global_step=resumed_at)
    assert (t_max1, t_max2) == (1192093, 1668931)  # Olmo 3 7B's t_max, from OLMo-core's Trainer

    micro = yaml.safe_load((ROOT / "configs" / "olmo3-7b.yaml").read_text())["train"]["micro_batch"]
    for world in (1, 8):  # 512 instances per step: the config's grad_accum on 1 rank, 512 / 8 / micro per rank on 8
        accum = 512 // micro // world
        ours, lengths = olmoc_lrs(build_dir, tmp_path, world, 1, steps, f"train.grad_accum={accum}",
                                  config=ROOT / "configs" / "olmo3-7b.yaml")
        assert lengths == [t_max1, t_max2]
        ref = np.empty(steps, dtype=np.float64)
        for s in range(1, steps + 1):
            ref[s - 1] = part1.get_lr(lr, s, t_max1) if s <= resumed_at else part2.get_lr(lr, s, t_max2)
        assert_same(ours, ref, 1)


def test_olmo3_7b_stage2_schedule(build_dir, tmp_path):
    """configs/olmo3-7b-stage2.yaml: LinearWithWarmup(warmup=0, alpha_f=0.0) over Duration.tokens(100B)
    at 2^21 tokens per step, fresh trainer state (OLMo-3-1025-7B-midtrain.py)."""
    lr = 0.00020712352850360292
    t_max = trainer_max_steps(100_000_000_000, 2**21)
    ours, lengths = olmoc_lrs(build_dir, tmp_path, 1, 1, t_max, config=ROOT / "configs" / "olmo3-7b-stage2.yaml")
    assert lengths[0] == t_max == 47684
    assert_same(ours, reference(LinearWithWarmup(warmup=0, alpha_f=0.0), lr, t_max, 1, t_max), 1)
