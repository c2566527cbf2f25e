"""scripts/import_olmo_core.py: an OLMo-core run stopped at a checkpoint, imported into olmoc and
continued with `olmoc train --resume`, against OLMo-core continuing from the same checkpoint.

The reference runs at test time: OLMo-core's own Trainer (TrainerConfig / TransformerTrainModuleConfig,
on the CPU, one process, no process group) trains a scaled-down Olmo 3 model (TransformerConfig.llama_like
with olmo3_7B's block, QK-norm, RoPE theta, norm eps and 3:1 sliding-window pattern; the torch attention
backend, since flash-attn needs a GPU) with SkipStepAdamW (the Olmo 3 7B recipe's optimizer; no step can
be skipped in a run this short: the window needs 64 losses) or torch's AdamW, no weight decay on the embeddings,
CosWithWarmup, z-loss and clipping, on a token file read by NumpyFSLDataLoader.  It stops at a
checkpoint (hard_stop) written by OLMo-core's Checkpointer; then a second Trainer loads that checkpoint
and runs to the end.  The importer turns the same checkpoint into an olmoc checkpoint and olmoc
continues: every continued step's CE loss, z-loss, gradient norm and learning rate, and all parameters
at the end, must agree (fp32 tolerances below; the continuation crosses into the data's second epoch).
The importer's refusals (a config that is not the run's, inputs that are not a checkpoint) are checked
by message.  Zeroing the imported exp_avg, resetting Adam's step counter or moving the data position
by one batch makes the comparison fail (checked by hand when the test was written).
"""
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import load_file

from test_cli import ROOT

V, SEQ, MICRO, ACCUM, SEED = 64, 32, 2, 2, 34521
STOP, TOTAL = 5, 10           # OLMo-core stops at step 5; both continue to step 10
N_INSTANCES = 30              # 7 batches of 4 an epoch: steps 8-10 read epoch 2
LR, WARMUP, ALPHA_F = 1e-2, 2, 0.1
# fp32 on the CPU, different kernels.  Measured (x86-64, this file's setup): continued CE and z-losses
# within 8e-8 relative, gradient norms within 1.5e-5 (step 9 of the step-0-checkpoint run; 1.3e-7
# otherwise), parameters at step 10 within 1.2e-7 absolute.  Tolerances: losses 1e-5, gradient norms
# 1e-4 (as the fidelity tests' gradients), parameters 1e-5.
LOSS_RTOL, GRAD_RTOL, PARAM_ATOL = 1e-5, 1e-4, 1e-5

CONFIG = f"""model:
  vocab_size: {V}
  d_model: 32
  n_layers: 4
  n_heads: 4
  n_kv_heads: 2
  mlp_hidden: 96
  rope_theta: 500000
  sliding_window: 8
  full_attention_every: 4
  full_attention_last: true
  rms_norm_eps: 1.0e-6
  eos_token_id: 0
  pad_token_id: 1
train:
  seq_len: {SEQ}
  micro_batch: {MICRO}
  grad_accum: {ACCUM}
  steps: {TOTAL}
  seed: {SEED}
  z_loss: 1.0e-5
  clip_grad_norm: 1.0
  lr: {LR}
  beta1: 0.9
  beta2: 0.95
  eps: 1.0e-8
  weight_decay: 0.1
  embedding_weight_decay: 0.0
  schedule: cos_with_warmup
  warmup_steps: {WARMUP}
  alpha_f: {ALPHA_F}
  save_every: 1000
  keep_last: 0
  eval_every: 0
  peak_flops: 1.0e12
data:
  dtype: uint16
  order: olmo_core
"""


def make_data(path):
    """EOS-separated documents with a bigram structure, as a raw uint16 memmap (OLMo-core's format)."""
    rng = np.random.default_rng(11)
    toks = []
    while len(toks) < N_INSTANCES * SEQ + 5:
        doc = [int(rng.integers(2, V))]
        for _ in range(int(rng.integers(8, 40))):
            doc.append((doc[-1] * 7 + 3) % (V - 2) + 2 if rng.random() < 0.8 else int(rng.integers(2, V)))
        toks += doc + [0]
    np.array(toks[:N_INSTANCES * SEQ + 5], dtype=np.uint16).tofile(path)


# ------------------------------------------------------------------------------ OLMo-core's side

def olmo_core(work, data, stop=None, load=None, step0=False, optimizer="skip_step_adamw"):
    """Runs OLMo-core's Trainer (in this process) to `stop` (hard_stop, writing a checkpoint there) or,
    from checkpoint `load`, to TOTAL; returns {step: CE loss, z-loss, grad norm, LR} and the model."""
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDataset
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
    from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.callbacks import Callback, CheckpointerCallback
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    torch.manual_seed(0)
    model = TransformerConfig.llama_like(
        vocab_size=V, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, hidden_size_multiple_of=32,
        block_name=TransformerBlockType.reordered_norm, qk_norm=True, rope_theta=500_000, layer_norm_eps=1e-6,
        sliding_window=SlidingWindowAttentionConfig(pattern=[8, 8, 8, -1], force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True),
        attn_backend=AttentionBackendName.torch).build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    assert model.blocks["0"].feed_forward.w1.weight.shape == (96, 32)  # mlp_hidden
    optim = {"skip_step_adamw": SkipStepAdamWConfig, "adamw": AdamWConfig}[optimizer](
        lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                group_overrides=[OptimGroupOverride(params=["embeddings.weight"],
                                                                    opts=dict(weight_decay=0.0))])
    tm = TransformerTrainModuleConfig(rank_microbatch_size=MICRO * SEQ, max_sequence_length=SEQ, optim=optim,
                                      z_loss_multiplier=1e-5, max_grad_norm=1.0,
                                      scheduler=CosWithWarmup(warmup=WARMUP, alpha_f=ALPHA_F)
                                      ).build(model, device=torch.device("cpu"))
    ds = NumpyFSLDataset(data, sequence_length=SEQ, pad_token_id=1, eos_token_id=0, vocab_size=V, dtype=np.uint16)
    ds.work_dir = work
    dl = NumpyDataLoaderBase.wrap_numpy_dataset(ds, global_batch_size=MICRO * ACCUM * SEQ,
                                                collator=DataCollator(pad_token_id=1), work_dir=work, seed=SEED,
                                                num_threads=0)
    records = {}

    class Record(Callback):
        def log_metrics(self, step, metrics):
            if "train/CE loss" in metrics:
                records[step] = {k: float(metrics[n]) for k, n in (
                    ("loss", "train/CE loss"), ("z_loss", "train/Z loss"), ("grad_norm", "optim/total grad norm"),
                    ("lr", "optim/LR (group 0)"))}

    trainer = TrainerConfig(
        save_folder=str(work / ("olmo_core_continued" if load else "olmo_core")), max_duration=Duration.steps(TOTAL), metrics_collect_interval=1,
        hard_stop=Duration.steps(stop) if stop else None, load_path=load,
        callbacks={"record": Record(),
                   "checkpointer": CheckpointerCallback(save_interval=STOP, ephemeral_save_interval=None,
                                                        pre_train_checkpoint=step0)}).build(tm, dl)
    trainer.fit()
    return records, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def importer(build_dir, *args):
    """scripts/import_olmo_core.py's main() in this process (OLMo-core is imported once)."""
    spec = importlib.util.spec_from_file_location("import_olmo_core", ROOT / "scripts" / "import_olmo_core.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main([*map(str, args), "--olmoc", str(build_dir / "olmoc")])


def olmoc_knows(build_dir, cfg, key_value):
    r = subprocess.run([str(build_dir / "olmoc"), "info", str(cfg), "--set", key_value], capture_output=True,
                       text=True)
    return r.returncode == 0


def hf_names():
    from olmo_core.nn.hf.convert import LAYER, OLMO_CORE_TO_HF_WEIGHT_MAPPINGS

    out = {}
    for src, dst in OLMO_CORE_TO_HF_WEIGHT_MAPPINGS.items():
        for i in range(4):
            out[src.replace(str(LAYER), str(i))] = dst.replace(str(LAYER), str(i))
    return out


def stop_olmo_core_run(work, step0, optimizer="skip_step_adamw"):
    """The config, the data, and OLMo-core's checkpoint at step STOP."""
    cfg = work / "tiny.yaml"
    cfg.write_text(CONFIG)
    data = work / "train.u16"
    make_data(data)
    first, _ = olmo_core(work, data, stop=STOP, step0=step0, optimizer=optimizer)
    assert sorted(first) == list(range(1, STOP + 1))
    return cfg, data, work / "olmo_core" / f"step{STOP}"


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    return stop_olmo_core_run(tmp_path_factory.mktemp("olmo_core_run"), step0=False)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,step0", [("skip_step_adamw", False), ("skip_step_adamw", True), ("adamw", False)],
                         ids=["skip_step_adamw", "skip_step_adamw-step0-checkpoint", "adamw"])
def test_import_and_continue_matches_olmo_core(build_dir, tmp_path, optimizer, step0, request):
    """SkipStepAdamW (the Olmo 3 recipe's) or torch's AdamW (OLMo-core's AdamWConfig).  step0: OLMo-core's
    default, a step-0 checkpoint of the fresh run, which shifts Adam's step counter by one
    (state["step"] = global_step + 1); olmoc continues it with train.optim_init_step."""
    if step0:
        (tmp_path / "tiny.yaml").write_text(CONFIG)
        if not olmoc_knows(build_dir, tmp_path / "tiny.yaml", "train.optim_init_step=true"):
            pytest.skip("this olmoc has no train.optim_init_step (OLMo-core's shifted Adam step counter), needed "
                        "to continue a run that saved a step-0 checkpoint")
    if step0 or optimizer != "skip_step_adamw":
        cfg, data, ckpt = stop_olmo_core_run(tmp_path, step0=step0, optimizer=optimizer)
    else:
        cfg, data, ckpt = request.getfixturevalue("stopped")
    ref, ref_params = olmo_core(ckpt.parents[1], data, load=str(ckpt), optimizer=optimizer)
    assert sorted(ref) == list(range(STOP + 1, TOTAL + 1))

    run = tmp_path / "run"
    assert importer(build_dir, ckpt, run, "--config", cfg, "--set", f"data.train_path={data}") == 0
    imported = run / f"step-{STOP:06d}"
    state = json.loads((imported / "state.json").read_text())
    assert state["step"] == STOP and state["tokens"] == STOP * MICRO * ACCUM * SEQ
    assert state["imported_from"]["adam_step"] == STOP + (1 if step0 else 0)
    assert state["loader"]["epoch"] == 0 and state["loader"]["pos"] == STOP * MICRO * ACCUM
    # the imported weights and moments are OLMo-core's at the checkpoint, by OLMo-core's own HF name table
    ck = olmo_core_state_at(ckpt)
    names = hf_names()
    model, optim = load_file(imported / "model.safetensors"), load_file(imported / "optim.safetensors")
    assert set(model) == {names[n] for n in ck["model"]}
    assert set(optim) == {f"{names[n]}.{s}" for n in ck["model"] for s in ("exp_avg", "exp_avg_sq")} | {"step"}
    for n, p in ck["model"].items():
        assert np.array_equal(model[names[n]], p), n
        for s in ("exp_avg", "exp_avg_sq"):
            assert np.array_equal(optim[f"{names[n]}.{s}"], ck["optim"][f"{n}.{s}"]), (n, s)
        assert ck["optim"][f"{n}.step"] == STOP + (1 if step0 else 0)
    assert optim["step"].tolist() == [STOP]  # updates applied; the shift is train.optim_init_step
    train = yaml.safe_load((imported / "config.yaml").read_text())["train"]
    assert train.get("optim_init_step", False) == step0
    assert train.get("optimizer", optimizer) == optimizer  # set by the importer where olmoc has the key

    c = subprocess.run([str(build_dir / "olmoc"), "train", str(imported / "config.yaml"), "--resume"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert c.returncode == 0, c.stdout[-3000:] + c.stderr
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    ours = {x["step"]: x for x in recs if x["type"] == "train"}
    assert sorted(ours) == list(range(STOP + 1, TOTAL + 1))
    worst, bad = {}, []
    for s in range(STOP + 1, TOTAL + 1):
        for k, rtol in (("loss", LOSS_RTOL), ("z_loss", LOSS_RTOL), ("grad_norm", GRAD_RTOL), ("lr", 1e-12)):
            rel = abs(ours[s][k] - ref[s][k]) / abs(ref[s][k])
            worst[k] = max(worst.get(k, 0.0), rel)
            if rel > rtol:
                bad.append(f"step {s} {k}: olmoc {ours[s][k]!r}, OLMo-core {ref[s][k]!r} (rel {rel:.2e})")
    final = load_file(run / f"step-{TOTAL:06d}" / "model.safetensors")
    diff = max(float(np.max(np.abs(final[names[n]] - p))) for n, p in ref_params.items())
    print(f"\ncontinued steps {STOP + 1}..{TOTAL}: worst relative difference {worst}; "
          f"parameters at step {TOTAL}: max |olmoc - OLMo-core| = {diff:.2e}")
    assert not bad, bad
    assert diff <= PARAM_ATOL


REFUSALS = [
    # (--set, what the message says)
    (["model.mlp_hidden=128"], "model.layers.0.mlp.gate_proj.weight is [96, 32] in the OLMo-core checkpoint but "
                               "[128, 32] by the config's model section"),
    (["model.n_layers=3"], "does not have the config's layers"),
    (["train.lr=0.02"], "peak learning rate (initial_lr) of embeddings.weight: the olmoc config says 0.02, the "
                        "OLMo-core optimizer 0.01"),
    (["train.embedding_weight_decay=0.1"], "weight decay of embeddings.weight"),
    (["train.beta2=0.999"], "beta2 of"),
    (["train.grad_accum=1"], "the olmoc global batch (micro_batch x grad_accum x --ranks = 2) differs"),
    (["train.seed=1"], "train.seed is 1, the OLMo-core data loader's seed 34521"),
    (["train.seq_len=16"], "train.seq_len is 16, the OLMo-core data loader's sequence_length 32"),
    (["data.order=olmoc"], "only data.order olmo_core continues OLMo-core's batches"),
    (["data.max_target_sequence_length=64"], "the OLMo-core dataset used max_target_sequence_length 32, olmoc's "
                                             "config 64: set data.max_target_sequence_length=32"),
]


@pytest.mark.parametrize("sets,message", REFUSALS, ids=[r[0][0] for r in REFUSALS])
def test_import_refuses_a_config_that_is_not_the_run(build_dir, tmp_path, stopped, capsys, sets, message):
    cfg, data, ckpt = stopped
    args = [ckpt, tmp_path / "run", "--config", cfg, "--set", f"data.train_path={data}"]
    for s in sets:
        args += ["--set", s]
    capsys.readouterr()
    assert importer(build_dir, *args) == 1
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.slow
def test_import_refuses_other_inputs(build_dir, tmp_path, stopped, capsys):
    cfg, data, ckpt = stopped
    base = ["--config", cfg, "--set", f"data.train_path={data}"]
    capsys.readouterr()
    assert importer(build_dir, tmp_path, tmp_path / "run", *base) == 1
    assert "is not an OLMo-core checkpoint (no model_and_optim/.metadata or train/rank0.pt)" in capsys.readouterr().err
    assert importer(build_dir, ckpt, tmp_path / "run", *base) == 0
    capsys.readouterr()
    assert importer(build_dir, ckpt, tmp_path / "run", *base) == 1  # never over an existing checkpoint
    assert f"step-{STOP:06d}' already exists" in capsys.readouterr().err
    # --optim-init-step yes on a counter equal to global_step: a shifted counter and one skipped step
    # (SkipStepAdamW), which needs train.optim_init_step and train.optimizer skip_step_adamw
    rc = importer(build_dir, ckpt, tmp_path / "run2", *base, "--optim-init-step", "yes")
    err = capsys.readouterr().err
    if olmoc_knows(build_dir, cfg, "train.optim_init_step=true"):
        assert rc == 0, err
        state = json.loads((tmp_path / "run2" / f"step-{STOP:06d}" / "state.json").read_text())
        assert state["skipped_steps"] == 1
        assert load_file(tmp_path / "run2" / f"step-{STOP:06d}" / "optim.safetensors")["step"].tolist() == [STOP - 1]
    else:
        assert rc == 1 and "needs olmoc's train.optim_init_step" in err, err
    # olmoc info --data: a number of ranks
    for bad in ("0", "x", "-1"):
        r = subprocess.run([str(build_dir / "olmoc"), "info", str(cfg), "--data", bad], capture_output=True,
                           text=True)
        assert r.returncode == 2 and "--data needs a number of ranks" in r.stderr


def olmo_core_state_at(ckpt):
    """The model and optimizer state of an OLMo-core checkpoint, by OLMo-core's unsharding loader."""
    from olmo_core.distributed.checkpoint import get_checkpoint_metadata, load_keys

    mo = str(ckpt / "model_and_optim")
    out = {"model": {}, "optim": {}}
    for prefix, part in (("model.", "model"), ("optim.state.", "optim")):
        keys = [k for k in get_checkpoint_metadata(mo).state_dict_metadata if k.startswith(prefix)]
        out[part] = {k[len(prefix):]: v.float().numpy() for k, v in zip(keys, load_keys(mo, keys))}
    return out
