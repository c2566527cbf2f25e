"""scripts/import_olmo_core.py on checkpoints it must not trust: a pickle planted in train/rank0.pt,
in the torch.distributed.checkpoint .metadata or in a pickled value inside the DCP data files is
refused with a message and runs nothing (before, each created the marker directory its __reduce__
names), and damaged or mistyped inputs end with one line on stderr and exit status 1, never a Python
traceback.  The checkpoints are small synthetic ones written with OLMo-core's own save_state_dict."""
import importlib.util
import os
import pickle
import subprocess
import sys

import pytest

from test_cli import ROOT

torch = pytest.importorskip("torch")
pytest.importorskip("olmo_core")

SCRIPT = ROOT / "scripts" / "import_olmo_core.py"


class Planted:
    """Unpickling this calls os.mkdir(marker): the stand-in for any code a checkpoint could run."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def trainer_state(**change):
    state = {"global_step": 3, "global_train_tokens_seen": 384,
             "data_loader": {"dataset_type": "fsl", "seed": 7, "epoch": 1, "batches_processed": 3,
                             "tokens_processed": 384, "sequence_length": 32}}
    state.update(change)
    return state


def make_checkpoint(step_dir, param_value=0.1, train_state=None):
    """An OLMo-core-shaped step directory: model_and_optim/ (DCP, written by OLMo-core) and
    train/rank0.pt (torch.save of a Trainer state)."""
    import warnings

    from olmo_core.distributed.checkpoint import save_state_dict

    # OLMo-core's flattened optimizer state: optim.state.<param>.*, optim.param_groups.<param>.*
    sd = {"model": {"w": torch.zeros(4, 3)},
          "optim": {"state.w.step": torch.tensor(3.0), "state.w.exp_avg": torch.zeros(4, 3),
                    "state.w.exp_avg_sq": torch.zeros(4, 3), "param_groups.w.lr": param_value,
                    "param_groups.w.betas": (0.9, 0.95), "param_groups.w.eps": 1e-8}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... a single process"
        save_state_dict(step_dir / "model_and_optim", sd, save_overwrite=True)
    (step_dir / "train").mkdir(parents=True, exist_ok=True)
    torch.save(trainer_state() if train_state is None else train_state, step_dir / "train" / "rank0.pt")
    return step_dir


def run_script(build_dir, step_dir, tmp_path):
    (tmp_path / "cfg.yaml").write_text("model:\n  vocab_size: 64\n")
    return subprocess.run([sys.executable, str(SCRIPT), str(step_dir), str(tmp_path / "out"), "--config",
                           str(tmp_path / "cfg.yaml"), "--olmoc", str(build_dir / "olmoc")],
                          capture_output=True, text=True, timeout=300)


def one_line_refusal(r, *needles):
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("import_olmo_core: "), r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_planted_metadata_and_trainer_state_run_nothing(build_dir, tmp_path):
    marker = tmp_path / "marker"
    good = make_checkpoint(tmp_path / "good")
    # .metadata that is a planted pickle, beside a valid train/rank0.pt
    meta_ckpt = make_checkpoint(tmp_path / "meta")
    (meta_ckpt / "model_and_optim" / ".metadata").write_bytes(pickle.dumps(Planted(marker)))
    r = run_script(build_dir, meta_ckpt, tmp_path)
    one_line_refusal(r, "cannot read the checkpoint metadata", "names posix.mkdir", "planted pickle")
    assert not marker.exists(), "the planted .metadata ran"
    # train/rank0.pt with a planted object, beside valid metadata
    pt_ckpt = make_checkpoint(tmp_path / "pt", train_state=trainer_state(global_step=Planted(marker)))
    r = run_script(build_dir, pt_ckpt, tmp_path)
    one_line_refusal(r, "cannot read the Trainer state", "rank0.pt", "planted pickle")
    assert not marker.exists(), "the planted rank0.pt ran"
    # the valid checkpoint gets past both (to the olmoc config, which this test's is not)
    r = run_script(build_dir, good, tmp_path)
    assert "cannot read" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()


def test_planted_value_in_the_dcp_data_runs_nothing(tmp_path):
    """DCP stores non-tensor values (the optimizer's param groups) as pickles inside its data files
    and unpickles them with torch.load(weights_only=False); inside the importer every torch.load is
    weights-only."""
    marker = tmp_path / "marker"
    step_dir = make_checkpoint(tmp_path / "ckpt", param_value=Planted(marker))
    spec = importlib.util.spec_from_file_location("import_olmo_core", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with mod.restricted_loading():
        meta, state, load = mod.read_olmo_core(step_dir)
        assert state["global_step"] == 3 and "optim.param_groups.w.lr" in meta
        assert load(["optim.param_groups.w.eps", "optim.param_groups.w.betas"]) == [1e-8, (0.9, 0.95)]
        assert load(["optim.state.w.step"])[0].item() == 3.0
        with pytest.raises(mod.Refused, match="cannot read the checkpoint data in .*planted pickle"):
            load(["optim.param_groups.w.lr"])
    assert not marker.exists(), "the planted value ran"
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None, "restricted_loading leaked its setting"


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("case,needles", [
    ("missing directory", ["is not an OLMo-core checkpoint"]),
    ("a file, not a directory", ["is not an OLMo-core checkpoint"]),
    ("truncated .metadata", ["cannot read the checkpoint metadata"]),
    ("truncated rank0.pt", ["cannot read the Trainer state", "rank0.pt"]),
    (".metadata of another type", ["is a dict, not torch.distributed.checkpoint Metadata"]),
    ("rank0.pt of another type", ["holds a list, not an OLMo-core Trainer state"]),
    ("data_loader of another type", ["data_loader is a str, not a dict"]),
    ("global_step not a number", ["global_step or data loader state is missing or not a number"]),
])
def test_bad_inputs_are_one_line(build_dir, tmp_path, case, needles):
    step_dir = tmp_path / "ckpt"
    if case == "missing directory":
        step_dir = tmp_path / "nowhere"
    elif case == "a file, not a directory":
        step_dir.write_text("x")
    else:
        make_checkpoint(step_dir)
        meta, pt = step_dir / "model_and_optim" / ".metadata", step_dir / "train" / "rank0.pt"
        if case == "truncated .metadata":
            truncate(meta)
        elif case == "truncated rank0.pt":
            truncate(pt)
        elif case == ".metadata of another type":
            meta.write_bytes(pickle.dumps({"state_dict_metadata": {}}))
        elif case == "rank0.pt of another type":
            torch.save([1, 2], pt)
        elif case == "data_loader of another type":
            torch.save(trainer_state(data_loader="fsl"), pt)
        elif case == "global_step not a number":
            torch.save(trainer_state(global_step="three"), pt)
    one_line_refusal(run_script(build_dir, step_dir, tmp_path), *needles)
