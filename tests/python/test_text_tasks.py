"""olmoc eval --task FILE.jsonl with text multiple choice:
{"context": "...", "choices": ["...", ...], "label": k} per line, tokenized with
the run's tokenizer and scored with OLMo's metrics.  The reference: the same
examples written as an oe-eval request directory, the path whose metrics
tests/python/test_olmo_eval.py checks against olmo_eval itself; both must
report identical values."""
import gzip
import json

import pytest
from safetensors.torch import save_file

from test_cli import olmoc
from test_fidelity import BASE_MODEL, random_params, write_config
from test_olmo_eval import SEQ_LEN, TOKENIZER


@pytest.fixture(scope="module")
def model(build_dir, tmp_path_factory):
    """A random model over the demo tokenizer's vocabulary, as a Hugging Face directory."""
    tmp = tmp_path_factory.mktemp("text_tasks")
    m = {**BASE_MODEL, "vocab_size": 8192, "eos_token_id": 0, "pad_token_id": 1}
    write_config(tmp / "model.yaml", m, {"seq_len": SEQ_LEN, "micro_batch": 8})
    save_file(random_params(m, seed=9), str(tmp / "model.safetensors"))
    r = olmoc(build_dir, "convert", "--to-hf", tmp / "model.safetensors", tmp / "hf", "--config", tmp / "model.yaml")
    assert r.returncode == 0, r.stderr
    return tmp, None

EXAMPLES = [
    {"context": "Question: What is the capital of France?\nAnswer:", "choices": [" Paris", " Rome", " Berlin"], "label": 0},
    {"context": "The café served crème brûlée and", "choices": [" coffee", " naïve tea", " 日本茶"], "label": 2},
    {"context": "2 + 2 =", "choices": [" 4", " 5"], "label": 0},
    {"context": "def f(x):\n    return", "choices": [" x * 2", " None", " f(x)", " 0"], "label": 1},
]


def run(build_dir, tmp, spec):
    r = olmoc(build_dir, "eval", tmp / "hf", "--tokenizer", TOKENIZER, "--task", spec, "--set",
              f"train.seq_len={SEQ_LEN}", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_text_jsonl_equals_request_dir(model, build_dir, tmp_path):
    tmp, _ = model
    f = tmp_path / "mc.jsonl"
    f.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in EXAMPLES) + "\n", encoding="utf-8")
    d = tmp_path / "mc_dir"
    d.mkdir()
    with gzip.open(d / "requests.jsonl.gz", "wt", encoding="utf-8") as g:
        for i, e in enumerate(EXAMPLES):
            for c, ch in enumerate(e["choices"]):
                g.write(json.dumps({"request_type": "loglikelihood", "doc_id": i, "idx": c, "label": e["label"],
                                    "request": {"context": e["context"], "continuation": ch}}) + "\n")
    for metric, primary in [("acc", "acc_raw"), ("len_norm", "acc_per_char")]:
        (d / "config.json").write_text(json.dumps({"task_config": {"primary_metric": primary}}))
        a = run(build_dir, tmp, f"{f}:{metric}" if metric != "acc" else str(f))
        b = run(build_dir, tmp, str(d))
        assert a["metric"] == metric and a["n"] == len(EXAMPLES)
        assert {k: v for k, v in a.items() if k != "task"} == {k: v for k, v in b.items() if k != "task"}
    print(f"\ntext .jsonl: {a}")


def test_text_jsonl_errors(model, build_dir, tmp_path):
    tmp, _ = model
    for lines, msg in [(['{"context": "a", "choices": [" b"], "label": 3}'], "'label' must be a choice index"),
                       (['{"context": "a", "choices": [], "label": 0}'], "'choices' must be a non-empty list"),
                       (['{"context": "a", "choices": [" b"], "label": 0}', '{"context": 5}'], "'context' must be"),
                       (['{"context": "a", "choices": [" b", 7], "label": 0}'], "choice 1 is not a string"),
                       (['{"context": "a", "choices": [" b"], "label": 0}', "not json"], "not a JSON object")]:
        f = tmp_path / "bad.jsonl"
        f.write_text("\n".join(lines) + "\n")
        r = olmoc(build_dir, "eval", tmp / "hf", "--tokenizer", TOKENIZER, "--task", f)
        assert r.returncode == 1 and msg in r.stderr, (lines, r.stderr)
    r = olmoc(build_dir, "eval", tmp / "hf", "--task", f)  # text needs a tokenizer
    assert r.returncode == 1 and "tokenizer" in r.stderr


def test_cached_scoring_equals_batched(model, build_dir, tmp_path, monkeypatch):
    """The KV-cache scoring (one prefill per distinct context) gives what the padded batched forward gives:
    a 5-shot task whose contexts are cut at seq_len (so prefixes differ per choice) and a fast mc one."""
    tmp, _ = model
    specs = "arc_easy_test_rc_5shot,arc_challenge_test_mc_5shot_fast,gsm8k_gold_bpb_5shot"
    args = ["eval", tmp / "hf", "--tokenizer", TOKENIZER, "--task", specs, "--limit", "4", "--set",
            "train.seq_len=192", "--set", "train.micro_batch=4", "--json"]
    r = olmoc(build_dir, *args)
    assert r.returncode == 0, r.stderr
    monkeypatch.setenv("OLMOC_EVAL_SCORING", "batched")
    b = olmoc(build_dir, *args)
    assert b.returncode == 0, b.stderr
    worst = 0.0
    for x, y in zip(map(json.loads, r.stdout.splitlines()), map(json.loads, b.stdout.splitlines())):
        assert x.keys() == y.keys() and x["n"] == y["n"]
        for k, v in x.items():
            if isinstance(v, float):
                err = abs(v - y[k]) / max(abs(y[k]), 1e-30)
                worst = max(worst, err)
                assert err < 1e-5, (x["task"], k, v, y[k])
    print(f"\nKV-cache vs batched scoring: worst relative difference {worst:.1e}")
