"""Paths inside a config file resolve against the file's directory; command-line paths against the
working directory; the config.yaml a run writes (run directory, checkpoints) carries absolute paths, so a
checkpoint read from anywhere names the same files."""
import os
import pathlib
import re
import shutil
import subprocess

from conftest import ROOT

DEMO = ROOT / "data" / "demo"


def info_values(build_dir, config, cwd, *extra):
    r = subprocess.run([str((build_dir / "olmoc").resolve()), "info", str(config), *extra], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(re.findall(r'^\s+(\w+): "(.*)"$', r.stdout, re.M))


def write_config(path, data_lines):
    text = (ROOT / "configs" / "olmo3-1m-8k.yaml").read_text()
    head = text[:text.index("\ndata:")]
    path.write_text(head + "\ndata:\n" + "".join(f"  {line}\n" for line in data_lines))


def test_relative_paths_follow_the_config_file(build_dir, tmp_path):
    cfgdir = tmp_path / "exp" / "configs"
    cfgdir.mkdir(parents=True)
    (tmp_path / "link").symlink_to(cfgdir)  # a ".." after a symbolic link stays: the kernel follows the link
    write_config(cfgdir / "a.yaml", [
        "train_path: ../data/train.npy",
        'val_paths: "../data/v1.npy, v2.npy,/abs/v3.npy,label=../data/v4.npy"',
        "tokenizer: ./tok.json",
        "out_dir: ../runs/a",
        'eval_tasks: "arc_easy_rc_0shot,tasks/mc.jsonl:acc,mine.jsonl,sub/dir"',
        'eval_tasks_dir: "oe:../more"',
    ])
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    v = info_values(build_dir, "../exp/configs/a.yaml", elsewhere)
    assert v["train_path"] == "../exp/data/train.npy"
    assert v["val_paths"] == "../exp/data/v1.npy,../exp/configs/v2.npy,/abs/v3.npy,label=../exp/data/v4.npy"
    assert v["tokenizer"] == "../exp/configs/tok.json"
    assert v["out_dir"] == "../exp/runs/a"
    # task names stay names; entries with a '/' or a .jsonl file are paths
    assert v["eval_tasks"] == ("arc_easy_rc_0shot,../exp/configs/tasks/mc.jsonl:acc,"
                               "../exp/configs/mine.jsonl,../exp/configs/sub/dir")
    assert v["eval_tasks_dir"] == "../exp/configs/oe:../exp/more"
    # leading ".." components stay, however many
    deeper = elsewhere / "deeper"
    deeper.mkdir()
    v = info_values(build_dir, "../../exp/configs/a.yaml", deeper)
    assert v["train_path"] == "../../exp/data/train.npy"
    assert v["eval_tasks_dir"] == "../../exp/configs/oe:../../exp/more"
    # from the config's own directory the values are as written
    v = info_values(build_dir, "a.yaml", cfgdir)
    assert v["train_path"] == "../data/train.npy" and v["tokenizer"] == "./tok.json"
    # through a symbolic link: "link/../data" is not "data"
    v = info_values(build_dir, "link/a.yaml", tmp_path)
    assert v["train_path"] == "link/../data/train.npy"
    # --set stays relative to the working directory
    v = info_values(build_dir, "../exp/configs/a.yaml", elsewhere, "--set", "data.train_path=mine.npy")
    assert v["train_path"] == "mine.npy"


def test_mix_weights_and_urls(build_dir, tmp_path):
    write_config(tmp_path / "m.yaml", ['mix: "a.npy+../b.npy:0.7, https://host/c.npy:0.3,s3://b/k.npy,/d.npy:1e-1"'])
    v = info_values(build_dir, tmp_path / "m.yaml", ROOT)
    t = str(tmp_path)
    assert v["mix"] == f"{t}/a.npy+{tmp_path.parent}/b.npy:0.7,https://host/c.npy:0.3,s3://b/k.npy,/d.npy:1e-1"


def test_run_from_elsewhere_and_checkpoint_read_back(build_dir, tmp_path):
    """A run started from another directory finds its data; its checkpoint's config names absolute paths,
    so `olmoc eval CHECKPOINT` from a third directory finds the validation file."""
    proj = tmp_path / "proj"
    (proj / "configs").mkdir(parents=True)
    (proj / "data").mkdir()
    for name in ("train.npy", "validation.npy"):
        shutil.copy(DEMO / name, proj / "data" / name)
    write_config(proj / "configs" / "r.yaml", [
        "train_path: ../data/train.npy",
        "val_paths: ../data/validation.npy",
        "out_dir: ../runs/r",
    ])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([str((build_dir / "olmoc").resolve()), "train", "proj/configs/r.yaml", "--set", "train.steps=2",
                        "--set", "train.seq_len=64", "--set", "train.micro_batch=2", "--set", "train.grad_accum=1",
                        "--set", "train.save_every=2", "--set", "train.eval_every=1000", "--set", "data.eval_tasks="],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    run = proj / "runs" / "r"
    assert (run / "step-000002" / "state.json").exists(), sorted(p.name for p in run.iterdir())
    for written in (run / "config.yaml", run / "step-000002" / "config.yaml"):
        text = written.read_text()
        assert f'train_path: "{proj}/data/train.npy"' in text, text
        assert f'out_dir: "{proj}/runs/r"' in text
    third = tmp_path / "third"
    third.mkdir()
    r = subprocess.run([str((build_dir / "olmoc").resolve()), "eval", str(run / "step-000002")], cwd=third, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validation" in r.stdout


def test_help_says_how_paths_resolve(build_dir):
    r = subprocess.run([str((build_dir / "olmoc").resolve()), "train", "--help"], capture_output=True, text=True, timeout=60)
    assert "relative to the config file" in r.stdout
