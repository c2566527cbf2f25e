"""olmoc generate vs transformers' generate on the same weights: greedy
decoding gives the same tokens (past the sliding window, so the KV cache's
ring buffer is exercised); sampling is seeded and well-formed.  The cached
decoder is also checked against the uncached forward pass at every step in
tests/c/test_train_system.c."""
import json

import pytest
import torch

from test_cli import builds, olmoc
from test_convert import HF_MODEL, make_hf_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("gen")
    hf = make_hf_model(HF_MODEL, seed=8)
    hf.save_pretrained(tmp / "hf")
    r = olmoc(build_dir, "convert", "--from-hf", tmp / "hf", tmp / "olmoc")
    assert r.returncode == 0, r.stderr
    return hf.double().eval(), tmp


def generate(build, src, ids, *args):
    r = olmoc(build, "generate", src, "--ids", ",".join(map(str, ids)), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["generated"]


@pytest.mark.parametrize("prompt_len", [1, 6, 70])
def test_greedy_matches_transformers(hf_pair, build_dir, prompt_len):
    hf, tmp = hf_pair
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, HF_MODEL["vocab_size"], (prompt_len,), generator=g).tolist()
    n_new = 24
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n_new,
                          eos_token_id=HF_MODEL["eos_token_id"], pad_token_id=HF_MODEL["pad_token_id"])
    expected = out[0, prompt_len:].tolist()
    for build in builds(build_dir):
        for src in (tmp / "olmoc", tmp / "hf"):  # the converted model, and the Hugging Face directory directly
            got = generate(build, src, prompt, "--max-new-tokens", str(n_new))
            assert got == expected, (str(src), got, expected)
    print(f"\ngreedy, prompt {prompt_len}: {len(expected)} tokens identical to transformers")


def test_sampling(hf_pair, build_dir):
    _, tmp = hf_pair
    src, prompt = tmp / "olmoc", [5, 6, 7]
    a = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "1",
                 "--max-new-tokens", "40", "--ignore-eos")
    b = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "1",
                 "--max-new-tokens", "40", "--ignore-eos")
    c = generate(build_dir, src, prompt, "--temperature", "1.0", "--top-p", "0.9", "--seed", "2",
                 "--max-new-tokens", "40", "--ignore-eos")
    assert a == b and a != c and len(a) == 40
    assert all(0 <= t < HF_MODEL["vocab_size"] for t in a)
    greedy = generate(build_dir, src, prompt, "--max-new-tokens", "10", "--ignore-eos")
    assert generate(build_dir, src, prompt, "--temperature", "1e-6", "--max-new-tokens", "10", "--ignore-eos") == greedy
    assert generate(build_dir, src, prompt, "--temperature", "5", "--top-p", "1e-9", "--max-new-tokens", "10",
                    "--ignore-eos") == greedy


def test_generate_errors(hf_pair, build_dir):
    _, tmp = hf_pair
    for build in builds(build_dir):
        for args, message in [(["--ids", "1,x"], "comma-separated token ids"),
                              (["--ids", "1,500"], "outside the vocabulary"),
                              (["--ids", "1", "--top-p", "0"], "--top-p expects"),
                              (["--ids", "1", "--temperature", "-1"], "--temperature expects")]:
            r = olmoc(build, "generate", tmp / "olmoc", *args)
            assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
        r = olmoc(build, "generate", tmp / "nothing", "--ids", "1")
        assert r.returncode == 1 and "does not exist" in r.stderr
