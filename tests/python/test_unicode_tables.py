"""The tokenizer's Unicode character classes against the reference's, over
every code point.

The pre-tokenizer regex (cl100k / dolma2) splits text by \\p{L}, \\p{N} and \\s,
so which code points are letters, digits or spaces decides the tokens.  olmoc
matches with PCRE2 and `tokenizers` with Oniguruma; each has its own Unicode
tables (Debian 12's PCRE2 10.42: Unicode 14; `tokenizers`: Unicode 16), and
scripts/setup.sh builds PCRE2 10.47 (Unicode 16.0.0) for this reason.

A probe tokenizer makes each split visible in the ids: byte-level BPE whose
only merges join a probe character (a, 1, !, space) with any following byte.
A merge applies only inside one pre-token, so in "a<cp>" the first id is the
merged pair exactly when the regex kept "a" and <cp> together (<cp> a
letter), and likewise "1<cp>" (a digit), "!<cp>" and " <cp>" (neither a space
nor, for "!", a letter or digit).  Every Unicode scalar value is probed."""
import json

import pytest
from tokenizers import Tokenizer

from tok_util import CL100K_PATTERN, c_encode

PROBES = ["a", "1", "!", " "]


def byte_level_chars():
    """GPT-2's byte -> printable character map, as ByteLevel uses it."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def probe_tokenizer_json():
    ch = byte_level_chars()
    vocab = {ch[b]: b for b in range(256)}
    merges = []
    for p in PROBES:
        pc = ch[ord(p)]
        for b in range(256):
            vocab[pc + ch[b]] = len(vocab)
            merges.append([pc, ch[b]])
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": CL100K_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def scalar_values():
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


# Several code points per document keep the record count (and time) down; the
# newline between probes always ends a pre-token, so probes do not interact.
PER_DOC = 64


def documents(cps):
    for i in range(0, len(cps), PER_DOC):
        yield "".join(f"{p}{chr(c)}\n" for c in cps[i : i + PER_DOC] for p in PROBES)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "tokenizer.json"
    path.write_text(json.dumps(probe_tokenizer_json()))
    return path


def test_probe_sees_the_classes(probe):
    """The probe itself: a letter joins 'a', a digit joins '1', a space joins neither."""
    ref = Tokenizer.from_file(str(probe))
    merged = lambda p, s: ref.encode(p + s).ids[0] >= 256  # noqa: E731
    assert merged("a", "b") and not merged("a", "1") and not merged("a", " ")
    assert merged("1", "2") and not merged("1", "b")
    assert merged("!", "?") and not merged("!", " ")


@pytest.mark.slow
def test_every_code_point_classified_as_the_reference(build_dir, probe, tmp_path):
    cps = scalar_values()
    docs = list(documents(cps))
    ref = Tokenizer.from_file(str(probe))
    expected = [e.ids for e in ref.encode_batch(docs)]
    got = c_encode(build_dir / "tests" / "tok_tool", probe, [d.encode("utf-8") for d in docs], tmp_path)
    bad = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    if bad:
        # name the code points: re-probe the first differing document one code point at a time
        first = cps[bad[0] * PER_DOC : (bad[0] + 1) * PER_DOC]
        singles = ["".join(f"{p}{chr(c)}\n" for p in PROBES) for c in first]
        one = c_encode(build_dir / "tests" / "tok_tool", probe, [d.encode("utf-8") for d in singles], tmp_path)
        differ = [f"U+{c:04X}" for c, g, d in zip(first, one, singles) if g != ref.encode(d).ids]
        pytest.fail(f"{len(bad)} of {len(docs)} documents ({PER_DOC} code points each) tokenize differently; "
                    f"in the first, {differ[:20]}")
    assert len(got) == len(expected) == len(docs)
