"""Builds demo token data: trains a small byte-level BPE (vocab 8192, EOS id 0,
PAD id 1) with Hugging Face tokenizers on the license texts Debian ships in
/usr/share/common-licenses, and writes the documents, each followed by EOS,
as a uint16 .npy token file (the OLMo data format)."""
import argparse
import glob
import pathlib

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="data/demo", help="output folder")
    ap.add_argument("--corpus", default="/usr/share/common-licenses", help="folder of text files")
    args = ap.parse_args()
    files = sorted(p for p in glob.glob(f"{args.corpus}/*") if pathlib.Path(p).is_file())
    if not files:
        raise SystemExit(f"make_demo_data: no text files in {args.corpus}")
    texts = [pathlib.Path(p).read_text(errors="replace") for p in files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8192, special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = []
    for text in texts:
        ids.extend(tok.encode(text).ids)
        ids.append(0)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    np.save(out / "train.npy", np.array(ids, dtype=np.uint16))
    print(f"make_demo_data: {len(files)} documents, {len(ids)} tokens -> {out / 'train.npy'}")


if __name__ == "__main__":
    main()
