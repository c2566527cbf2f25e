"""olmoc's optimizer step against OLMo-core's, at test time.

The reference is OLMo-core's own code: olmo_core.optim.SkipStepAdamW (built
with SkipStepAdamWConfig's defaults, foreach kernels), fed each step's CE loss
(latest_loss) and its gradient norm before clipping (latest_grad_norm) as
TransformerTrainModule does, clipped by TransformerTrainModule._clip_grad_norm,
with the LR set by OLMo-core's CosWithWarmup.set_lr from the trainer's
global_step (skipped steps count); or torch.optim.AdamW (AdamWConfig).  OLMo-core's
Trainer's step-0 checkpoint is reproduced by calling what it calls,
torch.distributed.checkpoint.state_dict.get_optimizer_state_dict, on the fresh
optimizer (it initialises the state with one zero-gradient, zero-LR step).

olmoc's side is tests/c/optim_tool: the same initial weights, per-step gradients
and losses through the trainer's step guard (olmo_step_check), clipping, LR
schedule and AdamW update.  The gradients are planted (no forward pass), with
loss and gradient-norm spikes that must be skipped; the weights are compared after
every step and the skipped steps must be the same.
"""
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from olmo_core.optim import SkipStepAdamW, SkipStepAdamWConfig
from olmo_core.optim.scheduler import CosWithWarmup
from olmo_core.train.train_module.transformer.train_module import TransformerTrainModule
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

# fp32 weights after every step: max |olmoc - OLMo-core| must stay below this.
# Both sides are fp32 with the same formula, but OLMo-core's foreach path computes
# the moments as m*(1-w)+g*w (olmoc: m+(g-m)*w, torch's lerp) and its bias
# corrections in float32 tensors (olmoc: double): rounding-level differences.
ATOL = 2e-6
LR, WARMUP = 1e-2, 3


def layout(build_dir, tmp_path):
    out = tmp_path / "layout.txt"
    r = subprocess.run([str(build_dir / "tests" / "optim_tool"), "layout", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = out.read_text().split("\n")
    n = int(lines[0])
    tensors = [(f[0], int(f[1]), int(f[2]), f[3] == "1") for f in (line.split() for line in lines[1:] if line)]
    return n, tensors


def planted(n, steps, seed, spikes_loss=(), spikes_norm=(), mild_loss=(), early_loss=()):
    """Initial weights, gradients and CE losses; spikes at the given 0-based steps."""
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal(n) * 0.02).astype(np.float32)
    grads = rng.standard_normal((steps, n)).astype(np.float32)
    grads *= (0.01 * rng.uniform(0.8, 1.2, size=(steps, 1))).astype(np.float32)  # norm ~0.43 +- 10%
    grads[::7] *= np.float32(3.0)  # some steps above clip_grad_norm 1.0
    losses = 3.0 + 0.02 * rng.standard_normal(steps)
    for s in tuple(spikes_loss) + tuple(early_loss):
        losses[s] += 0.5  # ~25 standard deviations
    for s in mild_loss:
        losses[s] += 0.102  # ~5.5 standard deviations: over sigma 5, under sigma 6
    for s in spikes_norm:
        grads[s] *= np.float32(20.0)
    return w0, grads, losses


def run_olmoc(build_dir, tmp_path, w0, grads, losses, sets, resume_at=None):
    prefix = tmp_path / "olmoc"
    w0.tofile(f"{prefix}.weights")
    grads.tofile(f"{prefix}.grads")
    losses.astype(np.float64).tofile(f"{prefix}.losses")
    args = [str(build_dir / "tests" / "optim_tool"), "run", str(prefix), str(len(losses))]
    for s in sets:
        args += ["--set", s]
    if resume_at:
        args += ["--resume-at", str(resume_at)]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = np.fromfile(f"{prefix}.out", dtype=np.float32).reshape(len(losses), -1)
    rows = [line.split() for line in open(f"{prefix}.steps").read().split("\n") if line]
    return out, np.array([int(r[0]) for r in rows], dtype=bool), np.array([float(r[1]) for r in rows])


def run_reference(tensors, w0, grads, losses, *, optimizer, clip, init_step, t_max, wd=0.1, emb_wd=0.0,
                  betas=(0.9, 0.95), eps=1e-8, **skip_kwargs):
    module = torch.nn.Module()
    module.ps = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.from_numpy(w0[off:off + numel].copy())) for _, off, numel, _ in tensors])
    params = list(module.ps)
    groups = [{"params": [p for p, t in zip(params, tensors) if t[3]], "weight_decay": emb_wd},
              {"params": [p for p, t in zip(params, tensors) if not t[3]], "weight_decay": wd}]
    if optimizer == "skip_step_adamw":
        defaults = SkipStepAdamWConfig()  # its foreach (True) and dtype (None) defaults
        opt = SkipStepAdamW(groups, lr=LR, betas=betas, eps=eps, weight_decay=wd, foreach=defaults.foreach,
                            dtype=defaults.dtype, **skip_kwargs)
    else:
        opt = torch.optim.AdamW(groups, lr=LR, betas=betas, eps=eps, weight_decay=wd)
    if init_step:
        get_optimizer_state_dict(module, opt)  # what OLMo-core's step-0 checkpoint does to a fresh optimizer
    sched = CosWithWarmup(warmup=WARMUP, alpha_f=0.1)
    train_module = SimpleNamespace(model=module)
    out, skipped, lrs = [], [], []
    for s in range(len(losses)):
        for p, (_, off, numel, _) in zip(params, tensors):
            p.grad = torch.from_numpy(grads[s, off:off + numel].copy())
        if optimizer == "skip_step_adamw":
            opt.latest_loss = torch.tensor(losses[s], dtype=torch.float32)
        if clip:
            norm = TransformerTrainModule._clip_grad_norm(train_module, clip)
            if optimizer == "skip_step_adamw":
                opt.latest_grad_norm = norm
        trainer = SimpleNamespace(global_step=s + 1, max_steps=t_max)
        lrs.append([sched.set_lr(g, trainer) for g in opt.param_groups][0])
        opt.step()
        skipped.append(optimizer == "skip_step_adamw" and bool(opt.step_skipped.item()))
        out.append(torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy())
        opt.zero_grad(set_to_none=True)
    # the layout's tensors are contiguous in file order, so the concatenation is olmoc's flat buffer
    assert [t[1] for t in tensors] == np.cumsum([0] + [t[2] for t in tensors[:-1]]).tolist()
    return np.stack(out), np.array(skipped), np.array(lrs)


CASES = {
    # name: (olmoc --set, reference kwargs, steps, spikes)
    "window16_sigma6": (["train.optimizer=skip_step_adamw", "train.rolling_interval_length=16"],
                        dict(optimizer="skip_step_adamw", clip=1.0, init_step=False, rolling_interval_length=16,
                             sigma_factor=6, step_increment_bugfix=True),
                        48, dict(spikes_loss=(7, 40), spikes_norm=(33,), mild_loss=(27,))),
    "defaults_init_step": (["train.optimizer=skip_step_adamw", "train.optim_init_step=true"],
                           dict(optimizer="skip_step_adamw", clip=1.0, init_step=True, rolling_interval_length=128,
                                sigma_factor=6, step_increment_bugfix=True),
                           100, dict(spikes_loss=(70, 77), spikes_norm=(80,), mild_loss=(90,), early_loss=(40,))),
    "sigma3_no_bugfix_no_clip": (["train.optimizer=skip_step_adamw", "train.rolling_interval_length=16",
                                  "train.sigma_factor=3", "train.step_increment_bugfix=false",
                                  "train.clip_grad_norm=0", "train.optim_init_step=true"],
                                 dict(optimizer="skip_step_adamw", clip=None, init_step=True, rolling_interval_length=16,
                                      sigma_factor=3, step_increment_bugfix=False),
                                 40, dict(spikes_loss=(20,), spikes_norm=(26,), mild_loss=(10,))),
    "adamw_init_step": (["train.optim_init_step=true"], dict(optimizer="adamw", clip=1.0, init_step=True), 12, {}),
    "adamw": ([], dict(optimizer="adamw", clip=1.0, init_step=False), 12, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_optimizer_steps_match_olmo_core(build_dir, tmp_path, case):
    sets, ref_kwargs, steps, spikes = CASES[case]
    n, tensors = layout(build_dir, tmp_path)
    w0, grads, losses = planted(n, steps, seed=7, **spikes)
    sets = sets + ["train.lr=%r" % LR, "train.warmup_steps=%d" % WARMUP, "train.steps=%d" % steps]
    ours, our_skips, our_lrs = run_olmoc(build_dir, tmp_path, w0, grads, losses, sets)
    ref, ref_skips, ref_lrs = run_reference(tensors, w0, grads, losses, t_max=steps, **ref_kwargs)
    # the planted spikes are skipped by OLMo-core (so the comparison below is not vacuous) ...
    if ref_kwargs["optimizer"] == "skip_step_adamw":
        planted_steps = set(spikes["spikes_loss"]) | (set(spikes["spikes_norm"]) if ref_kwargs["clip"] else set())
        assert planted_steps <= set(np.flatnonzero(ref_skips)), np.flatnonzero(ref_skips)
        # a spike before the window holds max(2, rolling_interval_length // 2) losses is not skipped
        assert not ref_skips[list(spikes.get("early_loss", ()))].any()
    # ... and by olmoc, and no other step
    assert np.array_equal(our_skips, ref_skips), (np.flatnonzero(our_skips), np.flatnonzero(ref_skips))
    np.testing.assert_array_equal(our_lrs, ref_lrs)
    diff = np.abs(ours.astype(np.float64) - ref).max(axis=1)
    print(f"{case}: skipped {np.flatnonzero(ref_skips).tolist()}, max |dw| per step: first {diff[0]:.3g}, "
          f"max {diff.max():.3g} (step {diff.argmax() + 1})")
    assert diff.max() <= ATOL, f"step {diff.argmax() + 1}: max |olmoc - OLMo-core| = {diff.max():.3g}"
    # the weights moved (the update is not a no-op on either side)
    assert np.abs(ref[-1] - w0).max() > 1e-3


def test_skip_window_survives_resume(build_dir, tmp_path):
    """The window (optimizer extra state) carried into a fresh trainer mid-run: the run continues exactly."""
    n, _ = layout(build_dir, tmp_path)
    w0, grads, losses = planted(n, 48, seed=11, spikes_loss=(12, 30), spikes_norm=(20,))
    sets = ["train.optimizer=skip_step_adamw", "train.rolling_interval_length=16", "train.steps=48"]
    full, full_skips, _ = run_olmoc(build_dir, tmp_path, w0, grads, losses, sets)
    resumed, resumed_skips, _ = run_olmoc(build_dir, tmp_path, w0, grads, losses, sets, resume_at=26)
    assert full_skips.any() and np.array_equal(full_skips, resumed_skips)
    assert np.array_equal(full, resumed)
