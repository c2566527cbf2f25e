"""Perplexity sets as OLMo-core's LM evaluator reports them.

The reference runs at test time through OLMo-core's own evaluation path: the
sets form one NumpyPaddedFSLDataset (one padded instance per document, its
first seq_len tokens; labelled by set, as LMEvaluatorCallbackConfig builds its
eval_dataset), LMEvaluator.from_numpy_dataset wraps it in a NumpyFSLDataLoader
(seed 0, reshuffled with epoch 1 on every pass; whole global batches of eval
micro-batch x ranks documents, the last incomplete one dropped) and iterating
the evaluator gives the batches; transformers' model (the olmoc model exported
to Hugging Face) gives the logits, get_labels the labels, and the un-reduced
cross-entropy goes to LMEvaluator.update_metrics; compute_metrics names and
reduces it ("<label>/CE loss", "<label>/PPL"; recorded by OLMo-core's
evaluator callback as "eval/lm/<label>/...").  For several data-parallel ranks
each rank's NumpyFSLDataLoader is built as from_numpy_dataset builds it and
every rank's batches update one evaluator (its metrics are sums reduced over
ranks).  olmoc eval --val-documents must give the same names, CE loss to 1e-5
relative, PPL = exp(CE loss), the same documents and token count (OLMo-core
averages over each instance's label_mask, its tokens, so the last token of a
document, which has no label, counts with a loss of 0); bits per byte = CE
sum / ln 2 / UTF-8 bytes of the label tokens, with the bytes counted here from
the tokenizer's byte-level vocabulary.  --val-all-documents reads every
document instead (checked against every instance of the same dataset)."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from test_cli import olmoc
from test_fidelity import BASE_MODEL, random_params, write_config
from test_olmo_eval import TOKENIZER

transformers = pytest.importorskip("transformers")
from olmo_core.data import DataCollator, NumpyFSLDataLoader, NumpyPaddedFSLDataset  # noqa: E402
from olmo_core.data.utils import get_labels  # noqa: E402
from olmo_core.eval import LMEvaluator  # noqa: E402

SEQ_LEN, BATCH, REL_TOL = 64, 4, 1e-5
LABELS = ["c4_en-validation", "dolma_books-validation"]  # names from OLMo-core's v3-small-ppl-validation manifest


def byte_level_bytes(tokenizer_json):
    """Each id's bytes: the byte-level alphabet (GPT-2's bytes_to_unicode) inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    inv = {chr(c): b for b, c in zip(bs, cs)}
    tok = json.loads(tokenizer_json.read_text())
    out = {i: bytes(inv[ch] for ch in t) for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        out[a["id"]] = b"" if a["special"] else a["content"].encode()
    return out


@pytest.fixture(scope="module")
def setup(build_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppl")
    model = {**BASE_MODEL, "vocab_size": 8192, "eos_token_id": 0, "pad_token_id": 1}
    write_config(tmp / "model.yaml", model, {"seq_len": SEQ_LEN, "micro_batch": BATCH})
    save_file(random_params(model, seed=4), str(tmp / "model.safetensors"))
    r = olmoc(build_dir, "convert", "--to-hf", tmp / "model.safetensors", tmp / "hf", "--config", tmp / "model.yaml")
    assert r.returncode == 0, r.stderr
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float64,
                                                           attn_implementation="eager").eval()
    rng = np.random.default_rng(0)
    paths = []
    for k, label in enumerate(LABELS):  # raw uint16 token files as OLMo-core reads them: documents end in EOS (0)
        docs = [rng.integers(2, 8192, size=int(n)) for n in rng.integers(1, 3 * SEQ_LEN, size=23 + 7 * k)]
        docs = [np.append(d, 0) for d in docs]
        tokens = np.concatenate(docs + [rng.integers(2, 8192, size=5)]).astype(np.uint16)  # a tail without EOS
        p = tmp / f"{label}.npy"
        tokens.tofile(p)
        paths.append(p)
    return tmp, hf, paths


def olmo_core_dataset(paths, tmp):
    ds = NumpyPaddedFSLDataset(*paths, sequence_length=SEQ_LEN, pad_token_id=1, eos_token_id=0, vocab_size=8192,
                               dtype=np.uint16, metadata=[{"label": lab} for lab in LABELS],
                               include_instance_metadata=True)
    ds.work_dir = tmp / "work"
    return ds


def olmo_core_batches(ds, world):
    """The batches OLMo-core's in-loop LM evaluator reads, every rank's."""
    collator = DataCollator(pad_token_id=1)
    if world == 1:  # exactly what LMEvaluatorCallbackConfig.build does, one rank
        ev = LMEvaluator.from_numpy_dataset(ds, name="lm", global_batch_size=BATCH * SEQ_LEN, collator=collator,
                                            device=torch.device("cpu"))
        return list(ev)
    ds.prepare()
    out = []
    for rank in range(world):  # from_numpy_dataset's loader on each rank of a world-rank process group
        dl = NumpyFSLDataLoader(ds, global_batch_size=BATCH * SEQ_LEN * world, collator=collator,
                                work_dir=ds.work_dir, seed=0, dp_world_size=world, dp_rank=rank)
        out += list(LMEvaluator(name="lm", batches=dl, labels=LABELS, device=torch.device("cpu")))
    return out


def every_document_batches(ds):
    """Every instance of the dataset in order (--val-all-documents)."""
    ds.prepare()
    items = [ds[i] for i in range(len(ds))]
    return [{"input_ids": torch.stack([x["input_ids"] for x in items[i:i + 8]]),
             "label_mask": torch.stack([x["label_mask"] for x in items[i:i + 8]]),
             "metadata": [x["metadata"] for x in items[i:i + 8]]} for i in range(0, len(items), 8)]


def reference(hf, batches, vocab_bytes):
    """OLMo-core's metrics over the batches, and per set: tokens averaged over, documents, label bytes."""
    ev = LMEvaluator(name="lm", batches=[], labels=LABELS, device=torch.device("cpu"))
    count = {lab: {"tokens": 0, "documents": 0, "bytes": 0} for lab in LABELS}
    for batch in batches:
        labels = get_labels(batch)
        with torch.no_grad():
            logits = hf(input_ids=batch["input_ids"]).logits
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                             reduction="none").reshape(labels.shape)
        ev.update_metrics(batch, ce, logits)
        for m, mask, row in zip(batch["metadata"], batch["label_mask"], labels):
            c = count[m["label"]]
            c["tokens"] += int(mask.sum())  # what LMEvaluator averages over
            c["documents"] += 1
            c["bytes"] += sum(len(vocab_bytes[int(t)]) for t in row if t >= 0)
    return {k: float(v) for k, v in ev.compute_metrics().items()}, count


def run_eval(build_dir, tmp, paths, *extra):
    val = ",".join(f"{lab}={p}" for lab, p in zip(LABELS, paths))
    r = olmoc(build_dir, "eval", tmp / "hf", "--val", val, "--val-documents", "--set", "data.dtype=uint16",
              "--set", f"train.seq_len={SEQ_LEN}", "--set", f"train.micro_batch={BATCH}", "--tokenizer", TOKENIZER,
              "--json", *extra)
    assert r.returncode == 0, r.stderr
    recs = {x["set"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert sorted(recs) == sorted(LABELS)
    return recs


def compare(recs, ref, count, what):
    for lab in LABELS:
        got = recs[lab]
        ce_name, ppl_name = f"eval/lm/{lab}/CE loss", f"eval/lm/{lab}/PPL"
        assert set(got["metrics"]) == {ce_name, ppl_name}
        want_ce = ref[f"{lab}/CE loss"]
        err = abs(got["metrics"][ce_name] - want_ce) / want_ce
        assert err < REL_TOL, (what, lab, got, want_ce)
        assert math.isclose(got["metrics"][ppl_name], math.exp(got["metrics"][ce_name]), rel_tol=1e-15)
        assert abs(got["metrics"][ppl_name] - ref[f"{lab}/PPL"]) / ref[f"{lab}/PPL"] < 2 * REL_TOL
        c = count[lab]
        assert (got["tokens"], got["documents"], got["bytes"]) == (c["tokens"], c["documents"], c["bytes"]), what
        assert got["labels"] == got["tokens"] - got["documents"]
        assert math.isclose(got["bpb"], got["loss"] * got["tokens"] / math.log(2) / c["bytes"], rel_tol=1e-12)
        print(f"\n{what}: {ce_name} = {got['loss']:.6f} (OLMo-core {want_ce:.6f}, rel err {err:.1e}), "
              f"PPL {got['ppl']:.3f}, BPB {got['bpb']:.4f}, {got['tokens']} tokens in {got['documents']} documents")


@pytest.mark.parametrize("world", [1, 2])
def test_lm_evaluator_matches_olmo_core(setup, build_dir, world):
    """The default: the documents OLMo-core's data loader reads (53 documents: 52 read with one rank,
    48 with two), for the run's rank count (--ranks)."""
    tmp, hf, paths = setup
    ds = olmo_core_dataset(paths, tmp / f"ranks{world}")
    batches = olmo_core_batches(ds, world)
    n_docs = len(ds)
    assert sum(len(b["metadata"]) for b in batches) == n_docs // (BATCH * world) * BATCH * world < n_docs
    ref, count = reference(hf, batches, byte_level_bytes(TOKENIZER))
    compare(run_eval(build_dir, tmp, paths, *(["--ranks", str(world)] if world > 1 else [])), ref, count,
            f"{world} rank(s)")


def test_every_document(setup, build_dir):
    """--val-all-documents: every document of each set, as every instance of OLMo-core's dataset."""
    tmp, hf, paths = setup
    vocab_bytes = byte_level_bytes(TOKENIZER)
    ref, count = reference(hf, every_document_batches(olmo_core_dataset(paths, tmp / "all")), vocab_bytes)
    recs = run_eval(build_dir, tmp, paths, "--val-all-documents")
    compare(recs, ref, count, "every document")
    for lab, path in zip(LABELS, paths):  # and the documents and bytes counted from the file itself
        tokens = np.fromfile(path, dtype=np.uint16)
        ends = np.nonzero(tokens == 0)[0]
        starts = np.concatenate([[0], ends[:-1] + 1])
        n_bytes = sum(len(vocab_bytes[int(t)]) for s, e in zip(starts, ends)
                      for t in tokens[s + 1:min(e + 1, s + SEQ_LEN)])
        assert recs[lab]["documents"] == len(ends) and recs[lab]["bytes"] == n_bytes
    # the default reads fewer documents, so its figures differ
    default = run_eval(build_dir, tmp, paths)
    assert sum(x["documents"] for x in default.values()) < sum(x["documents"] for x in recs.values())


def test_names_and_errors(setup, build_dir):
    tmp, _, paths = setup
    base = ["eval", tmp / "hf", "--set", "data.dtype=uint16", "--set", f"train.seq_len={SEQ_LEN}",
            "--set", f"train.micro_batch={BATCH}"]
    r = olmoc(build_dir, *base, "--val", f"c4_en-validation={paths[0]},{paths[1]}", "--batches", "2", "--json")
    assert r.returncode == 0, r.stderr
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["set"] for x in recs] == ["c4_en-validation", "dolma_books-validation"]  # LABEL=, else the file name
    assert all(math.isclose(x["ppl"], math.exp(x["loss"]), rel_tol=1e-15) for x in recs)
    r = olmoc(build_dir, *base, "--val", f"{paths[0]}", "--val-documents")  # no tokenizer: no bpb, text output
    assert r.returncode == 0 and "eval/lm/c4_en-validation/CE loss" in r.stdout and "BPB" not in r.stdout, r.stderr
    r = olmoc(build_dir, *base, "--val", "c4_en-validation=", "--val-documents")
    assert r.returncode != 0 and "no path after '='" in r.stderr
    no_eos = tmp / "noeos.npy"
    np.full(500, 7, dtype=np.uint16).tofile(no_eos)
    r = olmoc(build_dir, *base, "--val", f"x={no_eos}", "--val-documents")
    assert r.returncode != 0 and "no document" in r.stderr
    # 53 documents cannot fill one global batch of 4 x 14 ranks: OLMo-core's evaluator would read none
    r = olmoc(build_dir, *base, "--val", ",".join(map(str, paths)), "--val-documents", "--ranks", "14")
    assert r.returncode != 0 and "53 documents, fewer than one global evaluation batch of 56" in r.stderr, r.stderr
    assert "--val-all-documents" in r.stderr
    r = olmoc(build_dir, *base, "--val", ",".join(map(str, paths)), "--val-documents", "--ranks", "14",
              "--val-all-documents")
    assert r.returncode == 0, r.stderr
    # --batches 1: the first global batch (4 of the shuffled 53 documents); a set with none in it has no figure
    # (OLMo-core reports NaN) and is named in a note, the other is reported
    one = tmp / "one.npy"
    np.append(np.arange(2, 72), 0).astype(np.uint16).tofile(one)  # one document (and one seq_len window)
    perm = np.arange(24, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(1)).shuffle(perm)
    assert 23 not in perm[:4]  # the one-document set (index 23 after the 23 of c4_en-validation) is not read
    r = olmoc(build_dir, *base, "--val", f"c4_en-validation={paths[0]},one={one}", "--val-documents",
              "--batches", "1")
    assert r.returncode == 0, r.stderr
    assert "one: none of its documents is in the first 1 global batches" in r.stdout, r.stdout
    assert "eval/lm/c4_en-validation/CE loss" in r.stdout and "eval/lm/one/" not in r.stdout


def test_in_loop_perplexity_sets(setup, build_dir):
    """data.val_documents: the in-loop evaluation of olmoc train reports the perplexity sets as
    OLMo-core's LM evaluator does (its metric names, CE loss, PPL, BPB with data.tokenizer), with
    the same values as olmoc eval --val-documents (checked against OLMo-core above) on the run's
    final weights."""
    tmp, hf, paths = setup
    val = ",".join(f"{lab}={p}" for lab, p in zip(LABELS, paths))
    out = tmp / "inloop"
    common = ["--set", "data.dtype=uint16", "--set", f"data.tokenizer={TOKENIZER}",
              "--set", f"train.seq_len={SEQ_LEN}", "--set", f"train.micro_batch={BATCH}"]
    r = olmoc(build_dir, "train", tmp / "model.yaml", "--init", tmp / "model.safetensors", *common,
              "--set", f"data.train_path={paths[0]}", "--set", f"data.out_dir={out}",
              "--set", f"data.val_paths={val}", "--set", "data.val_documents=true", "--set", "train.steps=2",
              "--set", "train.eval_every=2", "--set", "train.eval_batches=1000", "--set", "train.peak_flops=1e12")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"eval step 2 | eval/lm/{LABELS[0]}/CE loss " in r.stdout and " | BPB " in r.stdout
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = {x["set"]: x for x in recs if x["type"] == "eval"}
    assert sorted(evals) == sorted(LABELS)
    r = olmoc(build_dir, "eval", out / "model.safetensors", "--config", out / "config.yaml", "--val", val,
              "--val-documents", *common, "--json")
    assert r.returncode == 0, r.stderr
    cli = {x["set"]: x for x in map(json.loads, r.stdout.splitlines())}
    for lab in LABELS:
        got, want = evals[lab], cli[lab]
        assert got["metrics"] == want["metrics"] and got["bpb"] == want["bpb"], (got, want)
        assert got["tokens"] == want["tokens"] and got["documents"] == want["documents"]
    assert sum(x["documents"] for x in evals.values()) == 52  # the 13 whole global batches of 4 of 53 documents
    # data.val_all_documents: every document, in the loop and in olmoc eval
    out2 = tmp / "inloop-all"
    r = olmoc(build_dir, "train", tmp / "model.yaml", "--init", tmp / "model.safetensors", *common,
              "--set", f"data.train_path={paths[0]}", "--set", f"data.out_dir={out2}",
              "--set", f"data.val_paths={val}", "--set", "data.val_documents=true", "--set", "train.steps=2",
              "--set", "data.val_all_documents=true",
              "--set", "train.eval_every=2", "--set", "train.eval_batches=1000", "--set", "train.peak_flops=1e12")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = [json.loads(x) for x in (out2 / "metrics.jsonl").read_text().splitlines()]
    evals = {x["set"]: x for x in recs if x["type"] == "eval"}
    r = olmoc(build_dir, "eval", out2 / "model.safetensors", "--config", out2 / "config.yaml", "--val", val,
              "--val-documents", *common, "--json")
    assert r.returncode == 0, r.stderr
    cli = {x["set"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert {lab: x["documents"] for lab, x in evals.items()} == {LABELS[0]: 23, LABELS[1]: 30}
    assert all(evals[lab]["metrics"] == cli[lab]["metrics"] for lab in LABELS)
