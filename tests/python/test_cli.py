"""olmoc's command line: help, clear errors on bad configs / files, and a
short real training run (loss goes down; identical reruns are bit-identical).
Error paths run the ASan+UBSan build too when OLMOC_BUILD_ASAN is set."""
import json
import os
import pathlib
import re
import struct
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]

TINY = """model:
  vocab_size: 64
  d_model: 32
  n_layers: 4
  n_heads: 4
  n_kv_heads: 2
  mlp_hidden: 64
  sliding_window: 8
  eos_token_id: 0
  pad_token_id: 1
train:
  seq_len: 32
  micro_batch: 2
  grad_accum: 2
  steps: 40
  lr: 2.0e-2
  warmup_steps: 2
"""


def builds(build_dir):
    dirs = [build_dir]
    asan = os.environ.get("OLMOC_BUILD_ASAN")
    if asan and (pathlib.Path(asan) / "olmoc").exists():
        dirs.append(pathlib.Path(asan))
    return dirs


SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def olmoc(build, *args, cwd=None):
    """Runs olmoc; on the sanitizer build with leak detection on, and any
    sanitizer report fails the test (a refused run exits 1 either way, so its
    exit status alone would not show a leak)."""
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS", ""), "detect_leaks=1"]))
    r = subprocess.run([str(build / "olmoc"), *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env)
    reports = [x for x in SANITIZER_REPORTS if x in r.stderr]
    assert not reports, f"olmoc {' '.join(map(str, args))}: {reports[0]}\n{r.stderr}"
    return r


@pytest.fixture
def tiny(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    rng = np.random.default_rng(0)
    # a learnable stream: EOS-separated documents where each token mostly
    # determines the next one (a bigram structure a few steps can pick up)
    docs = []
    for _ in range(60):
        doc = [int(rng.integers(2, 64))]
        for _ in range(int(rng.integers(10, 40))):
            doc.append((doc[-1] * 7 + 3) % 62 + 2 if rng.random() < 0.9 else int(rng.integers(2, 64)))
        docs.append(doc + [0])
    tokens = np.concatenate(docs).astype(np.uint16)
    data = tmp_path / "train.npy"
    np.save(data, tokens)
    return cfg, data


def test_help(build_dir):
    for args in (["--help"], ["train", "--help"], ["info", "--help"]):
        r = olmoc(build_dir, *args)
        assert r.returncode == 0 and "usage" in r.stdout


# every command, an option of it that takes a value, and an invalid value of an option with its message
COMMANDS = {
    "train": ("--set", None),
    "eval": ("--val", ("--batches", "0", "--batches expects an integer in [1, 1000000], got '0'")),
    "tokenize": ("--tokenizer", ("--threads", "0", "--threads expects an integer in [1, 1024], got '0'")),
    "generate": ("--prompt", ("--top-p", "0", "--top-p expects a number in (0, 1], got '0'")),
    "convert": ("--config", ("--dtype", "fp8", "--dtype must be float32 or bfloat16, got 'fp8'")),
    "info": ("--ranks", ("--ranks", "0", "--ranks needs an integer >= 1 (at most 1048576), got '0'")),
}


def test_every_command_parses_arguments_alike(build_dir):
    """One option table per command (src/cli/args.c): --help in one style
    (usage line, then one entry per option with its help from column 24),
    and an unknown option, a missing value or an invalid one is one line on
    stderr naming it, with exit code 2."""
    for build in builds(build_dir):
        for cmd, (takes_value, invalid) in COMMANDS.items():
            r = olmoc(build, cmd, "--help")
            assert r.returncode == 0 and r.stderr == "", (cmd, r.stderr)
            lines = r.stdout.splitlines()
            assert lines[0].startswith(f"usage: olmoc {cmd} "), lines[0]
            assert "\n\noptions:\n" in r.stdout or "\n\ninput:\n" in r.stdout, r.stdout
            assert lines.count("  -h, --help            show this help") == 1, r.stdout
            entries = [(i, line) for i, line in enumerate(lines) if re.match(r"  (-\w, )?--\w", line)]
            assert len(entries) >= 4 and f"  {takes_value} " in r.stdout, r.stdout
            for i, line in entries:
                names = line[:24].rstrip()
                if len(line) > 24 and line[22:24] == "  " and line[24] != " ":
                    assert names and "  " not in names.strip(), line
                else:  # names too wide for the column: the help on the next line
                    assert re.match(r" {24}\S", lines[i + 1]), (line, lines[i + 1])
                option = names.split(", ")[-1].split(" ")[0]
                r = olmoc(build, cmd, option)  # every option the help names is one the command knows
                assert "unknown option" not in r.stderr, (cmd, option, r.stderr)
            r = olmoc(build, cmd, "--frobnicate")
            assert r.returncode == 2 and r.stdout == "", (cmd, r.stdout)
            assert r.stderr == f"olmoc {cmd}: unknown option '--frobnicate' (see --help)\n", (cmd, r.stderr)
            r = olmoc(build, cmd, "x", takes_value)
            assert r.returncode == 2 and r.stderr == f"olmoc {cmd}: {takes_value} needs a value\n", (cmd, r.stderr)
            if invalid:
                option, value, message = invalid
                r = olmoc(build, cmd, option, value)
                assert r.returncode == 2 and r.stderr == f"olmoc {cmd}: {message}\n", (cmd, r.stderr)


def test_unknown_command(build_dir):
    r = olmoc(build_dir, "frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr


@pytest.mark.parametrize("text,message", [
    ("model:\n  d_modle: 32\n", "unknown key 'model.d_modle'"),
    ("model:\n  d_model: thirty\n", "expects an integer"),
    ("train:\n  lr: fast\n", "expects a number"),
    ("train:\n  intra_doc_masking: maybe\n", "expects true or false"),
    ("optimizer:\n  lr: 1\n", "unknown section 'optimizer'"),
    ("model:\n  d_model: [1, 2]\n", "a list is not valid"),
    ("model:\n\td_model: 1\n", "YAML error"),
    ("train:\n  schedule: step\n", "must be one of cosine (cos_with_warmup), linear (linear_with_warmup), constant"),
])
def test_config_errors(build_dir, tmp_path, text, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    for build in builds(build_dir):
        r = olmoc(build, "info", cfg)
        assert r.returncode == 1, r.stderr
        assert message in r.stderr and "bad.yaml" in r.stderr, r.stderr


@pytest.mark.parametrize("override,message", [
    ("model.n_heads=5", "must be divisible by model.n_heads"),
    ("model.n_kv_heads=3", "must be a multiple of model.n_kv_heads"),
    ("model.d_model=36", "must be even for RoPE"),
    ("model.eos_token_id=64", "outside the vocabulary"),
    ("train.beta2=1.5", "beta2 must be in [0, 1)"),
    ("train.nonsense=1", "unknown key 'train.nonsense'"),
])
def test_inconsistent_shapes(build_dir, tiny, override, message):
    cfg, _ = tiny
    for build in builds(build_dir):
        r = olmoc(build, "info", cfg, "--set", override)
        assert r.returncode == 1 and message in r.stderr, r.stderr


def test_info_counts(build_dir):
    r = olmoc(build_dir, "info", ROOT / "configs" / "olmo3-7b.yaml")
    assert r.returncode == 0, r.stderr
    assert "attention: SSSF" in r.stdout and "SSSFSSSFSSSFSSSFSSSFSSSFSSSF " in r.stdout
    # 7.3B parameters: the published size of Olmo 3 7B
    total = int(r.stdout.split("# parameters: ")[1].split()[0])
    assert 7.2e9 < total < 7.4e9


def test_bad_data_files(build_dir, tiny, tmp_path):
    cfg, data = tiny
    raw = data.read_bytes()
    cases = {
        "missing.npy": (None, "cannot open token file"),
        "truncated.npy": (raw[: len(raw) // 2], "truncated"),
        "notnpy.npy": (b"hello world, not numpy", "not a .npy file"),
        "float.npy": ("float", "wrong dtype at byte offset"),
        "big.npy": ("big", "is >= vocab size 64"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content == "float":
            np.save(path, np.zeros(100, dtype=np.float32))
        elif content == "big":
            np.save(path, np.full(256, 70, dtype=np.uint16))  # 8 instances: at least one global batch
        elif content is not None:
            path.write_bytes(content)
        for build in builds(build_dir):
            r = olmoc(build, "train", cfg, "--set", f"data.train_path={path}", "--set",
                      f"data.out_dir={tmp_path / 'out'}")
            assert r.returncode == 1 and message in r.stderr and name in r.stderr, (name, r.stderr)


def test_bad_safetensors(build_dir, tiny, tmp_path):
    cfg, data = tiny
    good = tmp_path / "good.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(64, 32)}, str(good))
    header_bomb = tmp_path / "bomb.safetensors"
    header_bomb.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    bad_offsets = tmp_path / "offsets.safetensors"
    hdr = b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,4000]}}'
    bad_offsets.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16)
    cases = [(good, "has no tensor 'model.layers.0.self_attn.q_proj.weight'"),
             (header_bomb, "header length"), (bad_offsets, "outside the")]
    for path, message in cases:
        for build in builds(build_dir):
            r = olmoc(build, "train", cfg, "--set", f"data.train_path={data}", "--init", path,
                      "--set", f"data.out_dir={tmp_path / 'out'}")
            assert r.returncode == 1 and message in r.stderr, (path, r.stderr)


def losses(stdout):
    return [float(line.split("loss ")[1].split()[0]) for line in stdout.splitlines() if line.startswith("step ")]


@pytest.mark.slow
def test_cpu_gemm_libraries_agree(build_dir, tiny, tmp_path):
    """Backend cpu (oneDNN's GEMMs when the build has oneDNN) and cpu-openblas
    train the same trajectory up to fp32 rounding, and say which library runs."""
    cfg, data = tiny
    rows, headers = {}, {}
    for backend in ("cpu", "cpu-openblas"):
        out = tmp_path / backend
        r = olmoc(build_dir, "train", cfg, "--backend", backend, "--set", f"data.train_path={data}",
                  "--set", f"data.out_dir={out}", "--set", "train.steps=8", "--set", "train.lr=2e-3")
        assert r.returncode == 0, r.stderr
        headers[backend] = next(line for line in r.stdout.splitlines() if line.startswith("backend "))
        rows[backend] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                         if json.loads(line)["type"] == "train"]
    assert "GEMMs: OpenBLAS" in headers["cpu-openblas"]
    onednn = "GEMMs: oneDNN" in headers["cpu"]
    assert onednn or "GEMMs: OpenBLAS" in headers["cpu"], headers["cpu"]
    assert len(rows["cpu"]) == 8
    for a, b in zip(rows["cpu"], rows["cpu-openblas"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * abs(a["grad_norm"]), (a, b)
    r = olmoc(build_dir, "train", cfg, "--backend", "cpu-onednn", "--set", f"data.train_path={data}",
              "--set", f"data.out_dir={tmp_path / 'onednn'}", "--set", "train.steps=1")
    if onednn:
        assert r.returncode == 0 and "backend cpu-onednn (GEMMs: oneDNN" in r.stdout, r.stderr
    else:
        assert r.returncode == 1 and "this build has no oneDNN" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", ["default", "convert"])
def test_cpu_bf16_trains_like_fp32(build_dir, tiny, tmp_path, monkeypatch, path):
    """cpu-bf16 (bf16 operands of the GEMMs and attention's products, fp32 accumulation,
    fp32 weights and AdamW) follows the fp32 trajectory within bf16 rounding and reruns
    bit-identically: on the processor's default path (oneDNN's bf16 matmul where it has one)
    and on the bf16-rounding + fp32-GEMM path every processor has (OLMOC_CPU_BF16=convert).
    cpu-bf16 is always available, so failing to create it fails the test."""
    if path == "convert":
        monkeypatch.setenv("OLMOC_CPU_BF16", "convert")
    else:
        monkeypatch.delenv("OLMOC_CPU_BF16", raising=False)
    cfg, data = tiny
    common = ("--set", f"data.train_path={data}", "--set", "train.steps=8", "--set", "train.lr=2e-3")
    rows = {}
    for name, backend in (("fp32", "cpu"), ("bf16", "cpu-bf16"), ("bf16-again", "cpu-bf16")):
        out = tmp_path / name
        r = olmoc(build_dir, "train", cfg, "--backend", backend, "--set", f"data.out_dir={out}", *common)
        assert r.returncode == 0, r.stderr
        rows[name] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                      if json.loads(line)["type"] == "train"]
    assert "backend cpu-bf16 (GEMMs: " in r.stdout and "bf16 operands" in r.stdout
    if path == "convert":
        assert "forced by OLMOC_CPU_BF16=convert" in r.stdout
    numbers = ("loss", "z_loss", "grad_norm", "lr")
    assert [[r[k] for k in numbers] for r in rows["bf16"]] == [[r[k] for k in numbers] for r in rows["bf16-again"]]
    assert rows["bf16"][-1]["loss"] < rows["bf16"][0]["loss"]
    # measured: losses within 5.4e-4, grad norms 1.0e-3 at step 1 and up to 6.6e-2 later (the tiny model's
    # training dynamics amplify the rounding, as in backend_parity_cpu_bf16's tolerances)
    for a, b in zip(rows["fp32"], rows["bf16"]):
        assert abs(a["loss"] - b["loss"]) <= 2e-3 * abs(a["loss"]), (a, b)
        norm_tol = 1e-2 if a["step"] == 1 else 2e-1
        assert abs(a["grad_norm"] - b["grad_norm"]) <= norm_tol * abs(a["grad_norm"]), (a, b)
        assert a["loss"] != b["loss"] or a["grad_norm"] != b["grad_norm"], "bf16 GEMMs must round somewhere"


def attention_fwd_model_flops(layout, window, seq_len, rows, heads, head_dim):
    """Attention's forward model FLOPs over `rows` sequences: 4 per visible (query, key) pair,
    query head and head_dim element (S = QK^T and PV), a query at t seeing min(t + 1, window) keys."""
    pairs = 0
    for kind in layout:
        w = seq_len if kind == "F" else min(window, seq_len)
        pairs += sum(min(t + 1, w) for t in range(seq_len))
    return 4.0 * pairs * rows * heads * head_dim


def profiled_attention(stdout):
    """{"fwd": (calls, model FLOPs), "bwd": ...} from a profile report."""
    out = {}
    for p in ("fwd", "bwd"):
        calls = int(re.search(rf"^profile: attention {p} +(\d+) ", stdout, re.M).group(1))
        flops = float(re.search(rf"^profile: attention {p} [0-9.]+ GFLOP/s over (\S+) model FLOP", stdout,
                                re.M).group(1))
        out[p] = (calls, flops)
    return out


def test_profile_counts_attention_flops(build_dir, tiny, tmp_path):
    """OLMOC_PROFILE=1 olmoc train times every op after the first step and reports attention's
    GFLOP/s over the model FLOPs of olmo_model_flops_per_token (4 per visible pair, head and
    head_dim element forward, 8 backward); bench_train --profile-steps N profiles only its last N steps."""
    cfg, data = tiny
    layout = re.search(r"# attention: ([SF]+)", olmoc(build_dir, "info", cfg).stdout).group(1)
    assert len(layout) == 4
    # the tiny config: seq_len 32, window 8, micro-batch 2, grad_accum 2, 4 query heads of 8
    per_step = attention_fwd_model_flops(layout, 8, 32, 2, 4, 8) * 2
    env = dict(os.environ, OLMOC_PROFILE="1")
    r = subprocess.run([str(build_dir / "olmoc"), "train", cfg, "--set", f"data.train_path={data}",
                        "--set", f"data.out_dir={tmp_path / 'run'}", "--set", "train.steps=3"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    att = profiled_attention(r.stdout)
    calls = len(layout) * 2 * 2  # layers x micro-batches x the 2 steps after the first
    assert att["fwd"][0] == att["bwd"][0] == calls, r.stdout
    # the report prints 3 significant digits
    assert abs(att["fwd"][1] - 2 * per_step) <= 6e-3 * 2 * per_step, (att, per_step)
    assert abs(att["bwd"][1] - 4 * per_step) <= 6e-3 * 4 * per_step, (att, per_step)

    r = subprocess.run([str(build_dir / "tests" / "bench_train"), cfg, "cpu", "--warmup", "1", "--steps", "2",
                        "--profile-steps", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("timed   step") == 2 and r.stdout.count("profile step") == 1, r.stdout
    att = profiled_attention(r.stdout)
    assert att["fwd"][0] == att["bwd"][0] == len(layout) * 2, r.stdout
    assert abs(att["fwd"][1] - per_step) <= 6e-3 * per_step, (att, per_step)
    r = subprocess.run([str(build_dir / "tests" / "bench_train"), cfg, "cpu", "--steps", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "profile:" not in r.stdout, r.stdout + r.stderr


def test_bench_train_arguments(build_dir, tiny):
    cfg, _ = tiny
    bench = str(build_dir / "tests" / "bench_train")
    r = subprocess.run([bench, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: bench_train" in r.stdout and "--profile-steps" in r.stdout
    for args, message in ((["--steps", "x"], "--steps wants a whole number"),
                          (["--profile-steps", "-1"], "--profile-steps >= 0"),
                          (["--peak-tflops", "fast"], "--peak-tflops wants a positive number"),
                          (["--frobnicate", "1"], "usage: bench_train")):
        r = subprocess.run([bench, cfg, "cpu", *args], capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


def test_training_learns_and_is_deterministic(build_dir, tiny, tmp_path):
    cfg, data = tiny
    runs = []
    for i in range(2):
        r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={data}", "--set",
                  f"data.out_dir={tmp_path / f'run{i}'}")
        assert r.returncode == 0, r.stderr
        runs.append(losses(r.stdout))
        assert (tmp_path / f"run{i}" / "model.safetensors").exists()
        assert (tmp_path / f"run{i}" / "config.yaml").exists()
    assert len(runs[0]) == 40
    assert runs[0] == runs[1], "same seed and data must give identical losses"
    first, last = np.mean(runs[0][:5]), np.mean(runs[0][-5:])
    assert last < first - 0.5, runs[0]


def test_info_redirected_to_a_file(build_dir, tmp_path):
    """`olmoc info CFG > file` gives the whole output, YAML first: the YAML
    goes through stdout itself, not a reopened /dev/stdout whose writes the
    later output overwrote."""
    import yaml

    cfg = ROOT / "configs" / "olmo3-7b.yaml"
    for build in builds(build_dir):
        out = tmp_path / f"info-{build.name}.txt"
        with open(out, "w") as f:
            r = subprocess.run([str(build / "olmoc"), "info", cfg], stdout=f, stderr=subprocess.PIPE, text=True)
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        parsed = yaml.safe_load(text)  # the '#' lines are comments
        assert parsed["model"]["n_layers"] == 32 and parsed["model"]["d_model"] == 4096, text[:400]
        assert text.startswith("model:\n") and "# attention: SSSF" in text
        piped = olmoc(build, "info", cfg)
        assert piped.returncode == 0 and piped.stdout == text


def test_info_prints_floats_as_written(build_dir, tmp_path):
    """olmoc info (and every config.yaml olmoc writes) prints a float as the shortest decimal that reads
    back as the same double: 0.003, not 0.0030000000000000001; and the printed config re-reads to itself."""
    cfg = ROOT / "configs" / "olmo3-1m.yaml"
    r = olmoc(build_dir, "info", cfg, "--set", "train.lr=0.00020712352850360292", "--set", "train.z_loss=1e-5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for want in ("  lr: 0.00020712352850360292", "  z_loss: 1e-05", "  rope_theta: 500000", "  init_std: 0.02",
                 "  beta2: 0.95"):
        assert want in lines, (want, [x for x in lines if x.startswith(want.split(":")[0])])
    yaml_part = tmp_path / "again.yaml"
    yaml_part.write_text("\n".join(x for x in lines if not x.startswith("#")) + "\n")
    again = olmoc(build_dir, "info", yaml_part)
    assert again.returncode == 0, again.stderr
    strip = lambda out: [x for x in out.splitlines() if not x.startswith("#")]  # noqa: E731
    assert strip(again.stdout) == strip(r.stdout)


def test_failed_start_removes_the_out_dir_it_made(build_dir, tiny, tmp_path):
    """A start that fails (here: a missing token file) removes the data.out_dir it created, with its .lock;
    an out_dir that was there before is kept."""
    cfg, _ = tiny
    out = tmp_path / "runs" / "new"
    r = olmoc(build_dir, "train", cfg, "--set", "data.train_path=/nonexistent/train.npy",
              "--set", f"data.out_dir={out}")
    assert r.returncode != 0 and "nonexistent" in r.stderr, r.stderr
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    r = olmoc(build_dir, "train", cfg, "--set", "data.train_path=/nonexistent/train.npy",
              "--set", f"data.out_dir={kept}")
    assert r.returncode != 0 and (kept / "notes.txt").read_text() == "mine\n"
