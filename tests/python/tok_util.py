"""Helpers for the tokenizer tests: a cl100k-style byte-level BPE trained with
`tokenizers` (the reference), varied test text, and the tok_tool protocol."""
import random
import struct
import subprocess

# The pre-tokenizer regex of cl100k_base, which the Olmo 3 dolma2 tokenizer uses.
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIALS = ["<|endoftext|>", "<|pad|>"]

WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or have an they which one you "
    "were all we her she there would their will when who him been has more if no out so what up said about into "
    "than them can only other time new some could these two may first then do any like my now over such our man "
    "me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three don't I'm we're they've she'll he'd it's isn't can't won't"
).split()

UNICODE_BITS = [
    "naïve café résumé", "Ünïcödé façade", "Straße", "ﬁnancial", "Ελληνικά κείμενα", "русский текст",
    "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "עברית", "العربية", "हिन्दी", "ไทย",
    "e\u0301 a\u0308 o\u0303 combining", "Z\u0351\u0352a\u0353l\u0354g\u0355o", "😀 😃 🎉👍🏽 👨‍👩‍👧‍👦 🇺🇸",
    "\u00a0non-breaking\u00a0space", "\u2028line\u2029para", "zero\u200bwidth", "\u3000ideographic space",
    "ſ long s 'ſ 'S 'T 'RE", "NEL\u0085here", "½ ¼ Ⅻ ² ³ ٣ ४", "x\u180ey", "\ufeffBOM", "\U0001d400\U0001d401",
]

CODE_BITS = [
    "def f(x):\n    return x**2 + 1\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if __name__ == '__main__':\n    main()\r\n",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "SELECT * FROM t WHERE id=42 AND name LIKE '%foo%';",
    "x = {'a': [1, 2, 3], \"b\": None}  # comment",
    "https://example.com/path?q=1&r=2#frag",
    "$ ls -la | grep \"\\.txt$\" > out.log 2>&1",
    "λx.x → ∀y ∈ ℝ: y² ≥ 0",
]

WS_BITS = ["  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "    \n\n   ", "\r", "\x0b\x0c", " \t \n"]

NUM_BITS = ["1", "12", "123", "1234", "12345", "3.14159", "1,000,000", "2024-06-01", "0x1F", "1e-9", "42nd", "007"]


def varied_text(rng: random.Random, n_items: int, specials: bool = True) -> str:
    parts = []
    for _ in range(n_items):
        r = rng.random()
        if r < 0.55:
            w = rng.choice(WORDS)
            if rng.random() < 0.1:
                w = w.capitalize()
            if rng.random() < 0.03:
                w = w.upper()
            parts.append(w)
        elif r < 0.65:
            parts.append(rng.choice(UNICODE_BITS))
        elif r < 0.72:
            parts.append(rng.choice(CODE_BITS))
        elif r < 0.82:
            parts.append(rng.choice(WS_BITS))
        elif r < 0.9:
            parts.append(rng.choice(NUM_BITS))
        elif r < 0.97:
            parts.append(rng.choice([".", ",", "!", "?", ";", ":", "...", "--", "(", ")", "\"", "'", "''", "!!!"]))
        elif specials:
            parts.append(rng.choice(SPECIALS + ["<|endoftext", "<|", "|>", "<|pad|><|pad|>"]))
        else:
            parts.append("#")
        parts.append(" " if rng.random() < 0.8 else "")
    return "".join(parts)


def train_tokenizer(path, texts, vocab_size=2000, pattern=CL100K_PATTERN, specials=SPECIALS, byte_level_regex=False,
                    add_prefix_space=False, split=True):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    steps = []
    if split:
        steps.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=byte_level_regex))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return tok


def write_records(path, blobs):
    with open(path, "wb") as f:
        for b in blobs:
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def write_id_records(path, seqs):
    with open(path, "wb") as f:
        for s in seqs:
            f.write(struct.pack("<I", len(s)))
            f.write(struct.pack(f"<{len(s)}I", *s))


def read_id_records(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        out.append(list(struct.unpack_from(f"<{n}I", data, i)))
        i += 4 * n
    return out


def read_records(path):
    data = open(path, "rb").read()
    out, i = [], 0
    while i < len(data):
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        out.append(data[i : i + n])
        i += n
    return out


def c_encode(tool, tokenizer_json, blobs, tmp_path, *extra):
    inp, outp = tmp_path / "enc_in.bin", tmp_path / "enc_out.bin"
    write_records(inp, blobs)
    subprocess.run([str(tool), "encode", str(tokenizer_json), str(inp), str(outp), *extra], check=True)
    return read_id_records(outp)


def c_decode(tool, tokenizer_json, seqs, tmp_path, *extra):
    inp, outp = tmp_path / "dec_in.bin", tmp_path / "dec_out.bin"
    write_id_records(inp, seqs)
    subprocess.run([str(tool), "decode", str(tokenizer_json), str(inp), str(outp), *extra], check=True)
    return read_records(outp)
