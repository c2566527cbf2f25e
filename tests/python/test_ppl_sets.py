"""Perplexity sets as OLMo-core's LM evaluator reports them.

The reference runs at test time: OLMo-core's NumpyPaddedFSLDataset cuts a raw
token file into one padded instance per document (its first seq_len tokens),
get_labels makes the labels, transformers' model (the olmoc model exported to
Hugging Face) gives the logits, the un-reduced cross-entropy goes to
olmo_core.eval.LMEvaluator.update_metrics and compute_metrics names and
reduces it ("<label>/CE loss", "<label>/PPL"; recorded by OLMo-core's evaluator
callback as "eval/lm/<label>/...").  olmoc eval --val-documents must give the
same names, CE loss to 1e-5 relative, PPL = exp(CE loss), the same token
count (OLMo-core averages over each instance's label_mask, its tokens, so the
last token of a document, which has no label, counts with a loss of 0); bits
per byte = CE sum / ln 2 / UTF-8 bytes of the label tokens, with the bytes
counted here from the tokenizer's byte-level vocabulary."""
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
from olmo_core.data import NumpyPaddedFSLDataset  # noqa: E402
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
        docs = [rng.integers(2, 8192, size=int(n)) for n in rng.integers(1, 3 * SEQ_LEN, size=23 + 6 * k)]
        docs = [np.append(d, 0) for d in docs]
        tokens = np.concatenate(docs + [rng.integers(2, 8192, size=5)]).astype(np.uint16)  # a tail without EOS
        p = tmp / f"{label}.npy"
        tokens.tofile(p)
        paths.append(p)
    return tmp, hf, paths


def reference(hf, paths, tmp):
    ds = NumpyPaddedFSLDataset(*paths, sequence_length=SEQ_LEN, pad_token_id=1, eos_token_id=0, vocab_size=8192,
                               dtype=np.uint16, metadata=[{"label": lab} for lab in LABELS],
                               include_instance_metadata=True)
    ds.work_dir = tmp / "work"
    ds.prepare()
    ev = LMEvaluator(name="lm", batches=[], labels=LABELS, device=torch.device("cpu"))
    items = [ds[i] for i in range(len(ds))]
    n_labels = {lab: 0 for lab in LABELS}
    for i in range(0, len(items), 8):
        chunk = items[i:i + 8]
        batch = {"input_ids": torch.stack([x["input_ids"] for x in chunk]),
                 "label_mask": torch.stack([x["label_mask"] for x in chunk]),
                 "metadata": [x["metadata"] for x in chunk]}
        labels = get_labels(batch)
        with torch.no_grad():
            logits = hf(input_ids=batch["input_ids"]).logits
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                             reduction="none").reshape(labels.shape)
        ev.update_metrics(batch, ce, logits)
        for m, mask in zip(batch["metadata"], batch["label_mask"]):
            n_labels[m["label"]] += int(mask.sum())  # what LMEvaluator averages over
    return {k: float(v) for k, v in ev.compute_metrics().items()}, n_labels, labels


def test_lm_evaluator_matches_olmo_core(setup, build_dir):
    tmp, hf, paths = setup
    ref, n_labels, _ = reference(hf, paths, tmp)
    val = ",".join(f"{lab}={p}" for lab, p in zip(LABELS, paths))
    r = olmoc(build_dir, "eval", tmp / "hf", "--val", val, "--val-documents", "--set", "data.dtype=uint16",
              "--set", f"train.seq_len={SEQ_LEN}", "--set", f"train.micro_batch={BATCH}", "--tokenizer", TOKENIZER,
              "--json")
    assert r.returncode == 0, r.stderr
    recs = {x["set"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert sorted(recs) == sorted(LABELS)
    vocab_bytes = byte_level_bytes(TOKENIZER)
    for lab, path in zip(LABELS, paths):
        got = recs[lab]
        ce_name, ppl_name = f"eval/lm/{lab}/CE loss", f"eval/lm/{lab}/PPL"
        assert set(got["metrics"]) == {ce_name, ppl_name}
        want_ce = ref[f"{lab}/CE loss"]
        err = abs(got["metrics"][ce_name] - want_ce) / want_ce
        assert err < REL_TOL, (lab, got, want_ce)
        assert math.isclose(got["metrics"][ppl_name], math.exp(got["metrics"][ce_name]), rel_tol=1e-15)
        assert abs(got["metrics"][ppl_name] - ref[f"{lab}/PPL"]) / ref[f"{lab}/PPL"] < 2 * REL_TOL
        assert got["tokens"] == n_labels[lab]
        # bits per byte from this file's documents, the bytes counted independently
        tokens = np.fromfile(path, dtype=np.uint16)
        ends = np.nonzero(tokens == 0)[0]
        starts = np.concatenate([[0], ends[:-1] + 1])
        n_bytes = sum(len(vocab_bytes[int(t)]) for s, e in zip(starts, ends)
                      for t in tokens[s + 1:min(e + 1, s + SEQ_LEN)])
        assert got["documents"] == len(ends) and got["bytes"] == n_bytes
        assert got["labels"] == got["tokens"] - got["documents"]
        assert math.isclose(got["bpb"], got["loss"] * got["tokens"] / math.log(2) / n_bytes, rel_tol=1e-12)
        print(f"\n{ce_name} = {got['loss']:.6f} (OLMo-core {want_ce:.6f}, rel err {err:.1e}), "
              f"PPL {got['ppl']:.3f}, BPB {got['bpb']:.4f}, {got['tokens']} tokens in {got['documents']} documents")


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
