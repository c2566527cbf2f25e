"""olmoc eval and in-loop evaluation: validation loss and multiple-choice
log-likelihoods against the float64 PyTorch reference (olmo3_ref.py), the
bundled tiny task (tests/data/tiny_mc.jsonl), and the task-file builder."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import olmo3_ref as ref
from test_cli import ROOT, TINY, builds, olmoc, tiny  # noqa: F401

TASK = ROOT / "tests" / "data" / "tiny_mc.jsonl"
MODEL = dict(vocab_size=64, d_model=32, n_layers=4, n_heads=4, n_kv_heads=2, mlp_hidden=64, rope_theta=500000.0,
             sliding_window=8, full_attention_every=4, full_attention_last=True, rms_norm_eps=1e-6, eos_token_id=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, build_dir):
    """The tiny config trained 60 steps, with in-loop evaluation at the end."""
    tmp = tmp_path_factory.mktemp("eval")
    cfg = tmp / "tiny.yaml"
    cfg.write_text(TINY)
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(80):
        doc = [int(rng.integers(2, 64))]
        for _ in range(int(rng.integers(10, 40))):
            doc.append((doc[-1] * 7 + 3) % 62 + 2 if rng.random() < 0.9 else int(rng.integers(2, 64)))
        docs.append(doc + [0])
    np.save(tmp / "train.npy", np.concatenate(docs[:60]).astype(np.uint16))
    np.save(tmp / "val.npy", np.concatenate(docs[60:]).astype(np.uint16))
    run = tmp / "run"
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={tmp / 'train.npy'}", "--set", f"data.out_dir={run}",
              "--set", "train.steps=60", "--set", "train.save_every=30", "--set", "train.eval_every=30",
              "--set", f"data.val_paths={tmp / 'val.npy'}", "--set", "train.eval_batches=3",
              "--set", f"data.eval_tasks={TASK}", "--set", "train.peak_flops=1e12")
    assert r.returncode == 0, r.stderr
    assert "eval step 60 | task tiny_mc | acc" in r.stdout
    return tmp, cfg, run


def params_of(ckpt):
    return {k: v.double() for k, v in load_file(str(ckpt / "model.safetensors")).items()}


def test_validation_loss_matches_reference(trained, build_dir):
    tmp, _, run = trained
    ckpt = run / "step-000060"
    r = olmoc(build_dir, "eval", ckpt, "--val", tmp / "val.npy", "--batches", "3", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[0])
    # reference: the first 3 micro-batches (2 rows of 32 tokens each) in file order
    tokens = torch.from_numpy(np.load(tmp / "val.npy")[: 6 * 32].astype(np.int64)).reshape(6, 32)
    logits = ref.forward(params_of(ckpt), tokens, MODEL)
    ce, _ = ref.loss_sums(logits, ref.labels_for(tokens))
    expected = ce.item() / (6 * 31)
    err = abs(got["loss"] - expected) / expected
    print(f"\nvalidation loss {got['loss']:.6f} vs reference {expected:.6f}: rel err {err:.2e}")
    assert err < 1e-5 and got["tokens"] == 6 * 31
    # the in-loop evaluation at step 60 saw the same weights and batches: bit-identical
    inloop = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val60 = [x for x in inloop if x["type"] == "eval" and x["step"] == 60]
    assert len(val60) == 1 and val60[0]["loss"] == got["loss"] and val60[0]["set"] == "val"
    # the run directory resolves to its newest checkpoint
    r2 = olmoc(build_dir, "eval", run, "--val", tmp / "val.npy", "--batches", "3", "--json")
    assert json.loads(r2.stdout.splitlines()[0])["loss"] == got["loss"]


def test_multiple_choice_scores_match_reference(trained, build_dir, tmp_path):
    tmp, _, run = trained
    ckpt = run / "step-000060"
    scores = tmp_path / "scores.jsonl"
    r = olmoc(build_dir, "eval", ckpt, "--task", TASK, "--scores-out", scores, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[0])
    examples = [json.loads(line) for line in TASK.read_text().splitlines()]
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert len(rows) == len(examples) == result["n"] == 40
    params = params_of(ckpt)
    worst, correct, correct_tok = 0.0, 0, 0
    for ex, row in zip(examples, rows):
        lps = []
        for choice in ex["choices"]:
            seq = torch.tensor([ex["context"] + choice])
            logp = torch.log_softmax(ref.forward(params, seq, MODEL)[0], dim=-1)
            start = len(ex["context"])
            lps.append(sum(logp[start + j - 1, t].item() for j, t in enumerate(choice)))
        worst = max(worst, max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(row["logprobs"], lps)))
        assert row["lengths"] == [len(c) for c in ex["choices"]] and row["label"] == ex["label"]
        correct += int(np.argmax(lps)) == ex["label"]
        correct_tok += int(np.argmax([lp / len(c) for lp, c in zip(lps, ex["choices"])])) == ex["label"]
    print(f"\nmultiple choice: acc {result['acc']:.3f} acc_per_token {result['acc_per_token']:.3f}, "
          f"log-likelihood rel err {worst:.2e}")
    assert worst < 1e-5
    assert result["acc"] == correct / 40 and result["acc_per_token"] == correct_tok / 40
    assert result["acc"] >= 0.8  # the model has learned the task's rule


def test_truncated_context_matches_olmo_eval(trained, build_dir, tmp_path):
    """Pre-tokenized examples longer than seq_len: the context is cut as OLMo's in-loop evaluator cuts it.
    The reference is OLMo-eval's own code at test time: ICLMultiChoiceTaskDataset.prep_examples builds
    the queries (context + choice without its last token, the last model_ctx_len tokens kept, ctx_len
    = len(query) - len(choice) + 1), collate_fn batches them, the float64 reference model gives the
    logits and ICLMetric.update sums each choice's log-probabilities."""
    from olmo_eval import ICLMetric
    from olmo_eval.tasks import ICLMultiChoiceTaskDataset

    _, _, run = trained
    ckpt = run / "step-000060"
    T = 32  # the tiny config's seq_len
    rng = np.random.default_rng(7)
    examples = []
    for n_ctx in [5, 20, 28, 31, 32, 33, 40, 60, 26, 29, 30, 45]:
        choices = [[int(v) for v in rng.integers(2, 64, int(rng.integers(1, 7)))] for _ in range(3)]
        examples.append({"context": [int(v) for v in rng.integers(2, 64, n_ctx)], "choices": choices,
                         "label": int(rng.integers(0, 3))})
    examples.append({"context": [5, 6, 7], "choices": [[9] * T, [10] * (T - 1)], "label": 0})  # a choice of seq_len
    task = tmp_path / "long.jsonl"
    task.write_text("".join(json.dumps(e) + "\n" for e in examples))
    scores = tmp_path / "scores.jsonl"
    r = olmoc(build_dir, "eval", ckpt, "--task", task, "--scores-out", scores, "--json")
    assert r.returncode == 0, r.stderr
    got = [json.loads(line)["logprobs"] for line in scores.read_text().splitlines()]

    def as_text(ids):  # one character per token id, so that OLMo-eval's string code sees token counts
        return "".join(chr(0x100 + i) for i in ids)

    class TokenIds(ICLMultiChoiceTaskDataset):
        metric_type = "acc"

        def __init__(self, docs):  # no dataset download: the documents are given
            self.tokenizer = type("Tok", (), {"bos_token_id": None, "pad_token_id": 1})()
            self.model_ctx_len, self.fixed_ctx_len, self.fast_mc = T, False, False
            self.prompts, self.current_prompt, self.log_instances = [None], None, 0
            self.dataset_name, self.dataset = "long", docs
            self.prep_examples()
            self._max_sequence_length = None

        def token_encode(self, string):
            return [ord(c) - 0x100 for c in string]

        def doc_to_text(self, doc):
            return as_text(doc["context"])

        def doc_to_continuations(self, doc):
            return [as_text(c) for c in doc["choices"]]

        def doc_to_label(self, doc):
            return doc["label"]

        def doc_to_domain_conditional(self, doc):
            return ""

    ds = TokenIds(examples)
    batch = ds.collate_fn([ds[i] for i in range(len(ds))])
    assert any(int(c) < len(s["ctx"]) for c, s in zip(batch["ctx_len"], ds.samples))  # contexts are cut
    metric = ICLMetric(metric_type="acc")
    params = params_of(ckpt)
    with torch.no_grad():
        metric.update(batch, ref.forward(params, batch["input_ids"][:, :T], MODEL))
    want = {(d, c): float(v) for d, c, v in metric.loglikelihoods}
    worst = 0.0
    for d, row in enumerate(got):
        assert len(row) == len(examples[d]["choices"])
        for c, lp in enumerate(row):
            worst = max(worst, abs(lp - want[(d, c)]) / max(abs(want[(d, c)]), 1e-3))
    print(f"\ntruncated contexts: log-likelihood rel err {worst:.2e} against OLMo-eval")
    assert worst < 1e-5
    task.write_text(json.dumps({"context": [5], "choices": [[9] * (T + 1), [10]], "label": 0}) + "\n")
    r = olmoc(build_dir, "eval", ckpt, "--task", task)
    assert r.returncode == 1 and "33 tokens, more than seq_len 32" in r.stderr, r.stderr


def test_untrained_model_is_near_chance(trained, build_dir, tmp_path):
    _, cfg, _ = trained
    out = tmp_path / "init"
    r = olmoc(build_dir, "train", cfg, "--set", f"data.train_path={trained[0] / 'train.npy'}", "--set",
              f"data.out_dir={out}", "--set", "train.steps=0", "--set", "train.peak_flops=1e12")
    assert r.returncode == 0, r.stderr
    r = olmoc(build_dir, "eval", out, "--task", TASK, "--json")  # a run directory without checkpoints
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["acc"] < 0.6


def test_task_file_errors(trained, build_dir, tmp_path):
    _, _, run = trained
    cases = {
        "label": ('{"context": [1, 2], "choices": [[3], [4]], "label": 2}', "'label' must be an index"),
        "range": ('{"context": [1, 99], "choices": [[3], [4]], "label": 0}', "not a token id in [0, 64)"),
        "keys": ('{"context": [1, 2], "label": 0}', "needs 'context', 'choices' and 'label'"),
        "one": ('{"context": [1, 2], "choices": [[3]], "label": 0}', "at least two"),
        "json": ('{"context": [1, 2', "not a JSON object"),
        "empty": ('', "has no examples"),
    }
    for name, (line, message) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text('{"context": [5], "choices": [[1], [2]], "label": 0}\n\n' + line + "\n" if line else "\n")
        for build in builds(build_dir):
            r = olmoc(build, "eval", run, "--task", path)
            assert r.returncode == 1 and message in r.stderr, (name, r.stderr)
            if name not in ("empty",):
                assert f"{name}.jsonl:3" in r.stderr, (name, r.stderr)  # file:line of the bad example
    r = olmoc(build_dir, "eval", run, "--set", "data.val_paths=", "--set", "data.eval_tasks=")
    assert r.returncode == 1 and "nothing to evaluate" in r.stderr


def test_make_mc_task_script(trained, build_dir, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "a", "red", "blue", "sky", "is"]
    tok = Tokenizer(models.WordLevel({w: i + 2 for i, w in enumerate(words)} | {"[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    text = tmp_path / "task.txt.jsonl"
    text.write_text(json.dumps({"context": "the cat sat on the", "choices": [" mat", " sky is blue"], "label": 0})
                    + "\n" + json.dumps({"context": "the sky is", "choices": [" red", " blue"], "label": 1}) + "\n")
    out = tmp_path / "task.jsonl"
    r = subprocess.run([sys.executable, ROOT / "scripts" / "make_mc_task.py", "--tokenizer", tmp_path / "tokenizer.json",
                        "--input", text, "--output", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {"context": [2, 3, 4, 5, 2], "choices": [[6], [12, 13, 11]], "label": 0}
    assert rows[1]["choices"] == [[10], [11]] and rows[1]["label"] == 1
    r = olmoc(build_dir, "eval", trained[2], "--task", out, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["n"] == 2, r.stderr
    bad = tmp_path / "bad.txt.jsonl"
    bad.write_text(json.dumps({"context": "the", "choices": ["cat"], "label": 0}) + "\n")
    r = subprocess.run([sys.executable, ROOT / "scripts" / "make_mc_task.py", "--tokenizer", tmp_path / "tokenizer.json",
                        "--input", bad, "--output", tmp_path / "x.jsonl"], capture_output=True, text=True)
    assert r.returncode != 0 and "bad.txt.jsonl:1" in r.stderr


# Names JSON must escape: quotes, backslashes, control characters (and none of
# ',' '/' ':' '=', which the lists and specs use)
HOSTILE = ['q"uote', "back\\slash", "ctl\x01\x1f\t\r\nend", 'all"\\\x7f\u00e9\x02']
TEXT_EXAMPLES = [{"context": "the cat sat on the", "choices": [" mat", " sky"], "label": 0},
                 {"context": "a b c", "choices": [" d", " x y"], "label": 1}]


def json_lines(text):
    """Every line parsed as JSON (split at newlines only: a JSON line holds no raw control character)."""
    lines = text.split("\n")
    assert lines[-1] == "", "no final newline"
    return [json.loads(line) for line in lines[:-1]]


def hostile_tasks(tmp_path):
    """Per name: a task file of token ids, a text task file and a request directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")} | {"\u0120": 28}  # byte-level space
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    requests = "".join(json.dumps({"request_type": "loglikelihood", "doc_id": i, "idx": c, "label": e["label"],
                                   "request": {"context": e["context"], "continuation": ch}}) + "\n"
                       for i, e in enumerate(TEXT_EXAMPLES) for c, ch in enumerate(e["choices"]))
    specs, olmo_names = [], []
    for sub in ("ids", "text", "dirs"):
        (tmp_path / sub).mkdir()
    for name in HOSTILE:
        (tmp_path / "ids" / f"{name}.jsonl").write_text(TASK.read_text())
        (tmp_path / "text" / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in TEXT_EXAMPLES))
        d = tmp_path / "dirs" / name
        d.mkdir()
        (d / "requests.jsonl").write_text(requests)
        (d / "config.json").write_text(json.dumps({"task_config": {"primary_metric": "acc_raw"}}))
        specs += [f"ids/{name}.jsonl", f"text/{name}.jsonl", f"dirs/{name}"]
        olmo_names += [f"{name}.jsonl", name]
    return ",".join(specs), HOSTILE + olmo_names  # token-id tasks first, then OLMo-eval's in order


def test_hostile_names_are_escaped(trained, build_dir, tmp_path):
    """Set and task names with quotes, backslashes and control characters: every line
    olmoc eval --json, --scores-out and the in-loop metrics.jsonl write is JSON naming them exactly."""
    tmp, cfg, run = trained
    build = build_dir.resolve()  # the commands run in tmp_path
    tasks, task_names = hostile_tasks(tmp_path)
    val = ",".join(f"{name}={tmp / 'val.npy'}" for name in HOSTILE)
    common = ["--val", val, "--task", tasks, "--tokenizer", "tokenizer.json", "--batches", "1", "--json"]
    for mode in ([], ["--val-documents", "--val-all-documents"]):
        r = olmoc(build, "eval", run / "step-000060", *common, "--scores-out", "scores.jsonl", *mode,
                  cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        recs = json_lines(r.stdout)
        sets = [x for x in recs if x["type"] == "eval"]
        assert [x["set"] for x in sets] == HOSTILE and len({x["loss"] for x in sets}) == 1, mode
        assert [x["task"] for x in recs if x["type"] == "downstream"] == task_names, mode
        if mode:
            assert all(list(x["metrics"]) == [f"eval/lm/{x['set']}/CE loss", f"eval/lm/{x['set']}/PPL"]
                       for x in sets)
        rows = json_lines((tmp_path / "scores.jsonl").read_bytes().decode())
        assert [x["task"] for x in rows] == [n for n in HOSTILE for _ in range(40)] + \
            [n for n in task_names[len(HOSTILE):] for _ in range(4)], mode
    # in-loop: the same records in metrics.jsonl, with the step
    out = tmp_path / "run"
    r = olmoc(build, "train", cfg, "--set", f"data.train_path={tmp / 'train.npy'}", "--set", f"data.out_dir={out}",
              "--set", "train.steps=2", "--set", "train.save_every=2", "--set", "train.eval_every=2",
              "--set", f"data.val_paths={val}", "--set", f"data.eval_tasks={tasks}", "--set", "train.eval_batches=1",
              "--set", "data.tokenizer=tokenizer.json", "--set", "train.peak_flops=1e12", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    inloop = [x for x in json_lines((out / "metrics.jsonl").read_bytes().decode()) if x["type"] != "train"]
    r = olmoc(build, "eval", out / "step-000002", *common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert all(x.pop("step") == 2 for x in inloop) and inloop == json_lines(r.stdout)


def test_help_and_usage(build_dir):
    for cmd in ("eval", "convert", "generate", "train"):
        r = olmoc(build_dir, cmd, "--help")
        assert r.returncode == 0 and r.stdout.startswith(f"usage: olmoc {cmd}"), cmd
        r = olmoc(build_dir, cmd)
        assert r.returncode == 2 and "usage" in r.stderr, cmd
    r = olmoc(build_dir, "--help")
    assert all(c in r.stdout for c in ("eval", "convert", "generate"))
    r = olmoc(build_dir, "convert", "--to-hf", "a", "b", "--dtype", "fp8")
    assert r.returncode == 2 and "--dtype must be" in r.stderr
