#!/usr/bin/env python3
"""Import an OLMo-core training checkpoint into an olmoc checkpoint, so that
`olmoc train --resume` continues where the OLMo-core run stopped.

    .venv/bin/python scripts/import_olmo_core.py OLMO_CORE_STEP_DIR OUT_DIR --config CFG.yaml \\
        [--set KEY=VALUE ...] [--ranks N] [--optim-init-step auto|yes|no] [--olmoc PATH]

OLMO_CORE_STEP_DIR is a checkpoint directory of OLMo-core's Trainer (`.../stepN/`, holding
`model_and_optim/`, the torch.distributed.checkpoint of TransformerTrainModule.state_dict_to_save(),
and `train/rank0.pt`, the Trainer's state).  It is read with OLMo-core's own code
(olmo_core.distributed.checkpoint.load_keys: one unsharded tensor at a time, whatever the sharding
it was saved with) and written as OUT_DIR/step-NNNNNN/ (NNNNNN = the Trainer's global_step):

  model.safetensors  the weights, fp32, under the Hugging Face Olmo3 names olmoc uses (OLMo-core's
                     own olmo_core.nn.hf.convert.OLMO_CORE_TO_HF_WEIGHT_MAPPINGS)
  optim.safetensors  AdamW / SkipStepAdamW exp_avg and exp_avg_sq (fp32) and Adam's step counter
  config.yaml        the olmoc config (CFG.yaml with the --set overrides and data.out_dir = OUT_DIR,
                     resolved by `olmoc info`)
  state.json         the step, tokens, the data loader's epoch and position (OLMo-core's
                     batches_processed x the global batch: with data.order olmo_core, olmoc's batch k is
                     OLMo-core's batch k), the loader fingerprint (`olmoc info --data`), file hashes

Continue with `olmoc train OUT_DIR/step-NNNNNN/config.yaml --resume [--set train.steps=...]` (the
command is printed).  The config must describe the same model (the tensor shapes are checked),
train.seq_len, train.seed, and global batch (micro_batch x grad_accum x ranks instances) as the
OLMo-core run, and its AdamW betas, eps, weight decays and peak lr must equal the optimizer's param
groups (checked: a mismatch is refused, naming the value).

Adam's step counter: OLMo-core's Trainer saves a step-0 checkpoint of a fresh run, and taking that
optimizer state dict first runs one zero-gradient, zero-LR step, so its state["step"] is global_step
+ 1 (no update ever differs: the bias corrections are shifted by one).  olmoc models this with
train.optim_init_step: --optim-init-step auto (the default) sets it when state["step"] is
global_step + 1, leaves it off when they are equal, and asks for yes/no otherwise (SkipStepAdamW's
skipped steps do not advance state["step"]: steps skipped = global_step - (state["step"] - shift),
written as skipped_steps).  SkipStepAdamW's rolling window of losses and gradient norms is not
part of OLMo-core's checkpoint (it restarts empty when OLMo-core resumes, too).

state.json's file hashes are XXH3-64 ("hash": "xxh3_64", src/train/checkpoint_hash.c), computed
here with the xxhash package.
"""
import argparse
import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import xxhash

ROOT = Path(__file__).resolve().parents[1]
CKPT_FORMAT, CKPT_VERSION = "olmoc-checkpoint", 1  # src/train/checkpoint_internal.h, checkpoint_state.c


class Refused(Exception):
    pass


# ---------------------------------------------------------------- file hashes (src/train/checkpoint_hash.c)

HASH_NAME = "xxh3_64"  # state.json's "hash": what its "hash64" entries are


def hash64_file(path, chunk=1 << 24):
    """XXH3-64 (seed 0) of a file's bytes, read in chunks, and its size."""
    h = xxhash.xxh3_64()
    size = 0
    with open(path, "rb") as f:
        while data := f.read(chunk):
            h.update(data)
            size += len(data)
    if size != os.path.getsize(path):
        raise Refused(f"'{path}' changed while it was hashed")
    return h.intdigest(), size


# ------------------------------------------------------------------------- safetensors, streamed

def write_safetensors(path, entries):
    """entries: [(name, dtype 'F32'|'I64', shape, producer() -> numpy array)], written in order,
    one tensor in memory at a time (the header is computed from the shapes first)."""
    itemsize = {"F32": 4, "I64": 8}
    header, offset = {}, 0
    for name, dtype, shape, _ in entries:
        n = int(np.prod(shape, dtype=np.int64)) * itemsize[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, produce in entries:
            a = np.ascontiguousarray(produce(), dtype={"F32": "<f4", "I64": "<i8"}[dtype])
            if tuple(a.shape) != tuple(shape):
                raise Refused(f"tensor '{name}' has shape {tuple(a.shape)}, expected {tuple(shape)}")
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------------- olmoc side

def olmoc_info(olmoc, config, sets, ranks):
    """The resolved config (YAML text) and the data line of `olmoc info --data`."""
    cmd = [str(olmoc), "info", str(config)]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--data", str(ranks)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise Refused(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    m = re.search(r"^# data: (\d+) instances per epoch, (\d+) in the files, global batch (\d+), fingerprint (\d+)$",
                  r.stdout, re.M)
    if not m:
        raise Refused(f"`olmoc info --data` printed no data line; is {olmoc} an olmoc with --data?")
    yaml_text = "".join(line + "\n" for line in r.stdout.splitlines() if not line.startswith("#"))
    return yaml_text, {"n_instances": int(m[1]), "dataset_instances": int(m[2]), "batch": int(m[3]),
                       "fingerprint": int(m[4])}


# ------------------------------------------------------------------------------- OLMo-core side

def hf_name_map(olmo_core_names):
    """OLMo-core parameter name -> Hugging Face name, from OLMo-core's own conversion table."""
    from olmo_core.nn.hf.convert import LAYER, OLMO_CORE_TO_HF_WEIGHT_MAPPINGS

    rules = []
    for src, dst in OLMO_CORE_TO_HF_WEIGHT_MAPPINGS.items():
        if "[" in src.replace(str(LAYER), ""):
            continue  # expert templates (MoE)
        pattern = "^" + re.escape(src).replace(re.escape(str(LAYER)), r"(\d+)") + "$"
        rules.append((re.compile(pattern), dst))
    out = {}
    for name in olmo_core_names:
        for pat, dst in rules:
            m = pat.match(name)
            if m:
                out[name] = dst.replace(str(LAYER), m[1]) if m.groups() else dst
                break
        else:
            raise Refused(f"OLMo-core parameter '{name}' has no Olmo3 (Hugging Face) counterpart: not an "
                          "Olmo 3 dense model olmoc can train")
    return out


# ------------------------------------------------------------- no code from a checkpoint
#
# A pickle can name any callable and call it (a __reduce__), so nothing of a checkpoint is unpickled
# without an allow-list: train/rank0.pt and the pickled values inside the DCP files (the param groups'
# floats and tuples) go through torch.load(weights_only=True), which admits containers, numbers,
# strings and tensors (and here numpy arrays: the Trainer state's numpy RNG state); the DCP .metadata
# through MetadataUnpickler, which admits the classes of torch.distributed.checkpoint's metadata and
# nothing else.

# (module, name) -> what a .metadata pickle may name: its dataclasses, torch.Size, and the layout
# and dtype constants (checked to be those: see find_class)
DCP_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("olmo_core.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
}


class MetadataUnpickler(__import__("pickle").Unpickler):
    """Unpickles a torch.distributed.checkpoint .metadata file, refusing every global outside
    DCP_METADATA_CLASSES (besides torch's dtypes and its layout lookup, which return only
    torch.dtype / torch.layout values)."""

    def find_class(self, module, name):
        import pickle

        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            from torch.serialization import _get_layout

            def layout(s):
                v = _get_layout(s)
                if not isinstance(v, torch.layout):
                    raise pickle.UnpicklingError(f"'{s}' is not a torch layout")
                return v
            return layout
        if (module, name) not in DCP_METADATA_CLASSES:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint's metadata never holds "
                                         "(a planted pickle that could run code?)")
        return super().find_class(module, name)


class _RestrictedPickle:
    """Stands in for the pickle module in OLMo-core's checkpoint reader (its read_metadata calls
    pickle.load), so that every reading of .metadata, load_keys' included, is restricted."""

    def __getattr__(self, name):
        return getattr(__import__("pickle"), name)

    @staticmethod
    def load(f):
        return MetadataUnpickler(f).load()


def checkpoint_problem(what, path, e):
    """A one-line Refused for an unreadable or planted checkpoint file."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()] or [""]
    # torch.distributed.checkpoint wraps a rank's error with its traceback: its last line says what
    first = lines[-1] if "Traceback" in str(e) else lines[0]
    if "weights_only" in str(e) or "Unsupported global" in str(e) or "Unsupported operand" in str(e):
        first = "it holds objects other than containers, numbers, strings and tensors (a planted pickle " \
                "that could run code?): " + next((ln.strip() for ln in str(e).splitlines()
                                                  if "Unsupported" in ln or "GLOBAL" in ln
                                                  or "Can only build" in ln), first)
    return Refused(f"cannot read {what} '{path}': {first or type(e).__name__}")


@contextlib.contextmanager
def restricted_loading():
    """While the import runs: every torch.load of this process, DCP's own of pickled values included,
    admits only data (TORCH_FORCE_WEIGHTS_ONLY_LOAD), and OLMo-core's reader unpickles .metadata
    through MetadataUnpickler."""
    import olmo_core.distributed.checkpoint.filesystem as oc_fs
    import torch

    saved_env, saved_pickle = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD"), oc_fs.pickle
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    oc_fs.pickle = _RestrictedPickle()
    try:
        # the Trainer state holds numpy's RNG state: a uint32 ndarray (numpy arrays of plain dtypes
        # are data; their constructor only ever makes an ndarray)
        core = getattr(np, "_core", None) or np.core
        dtypes = [type(np.dtype(t)) for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                              np.int64, np.uint64, np.float16, np.float32, np.float64)]
        with torch.serialization.safe_globals([core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]):
            yield
    finally:
        oc_fs.pickle = saved_pickle
        if saved_env is None:
            del os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"]
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved_env


def read_olmo_core(step_dir):
    import pickle

    import torch
    import olmo_core.distributed.checkpoint.filesystem as oc_fs
    from olmo_core.distributed.checkpoint import load_keys
    from torch.distributed.checkpoint.metadata import Metadata

    mo = step_dir / "model_and_optim"
    train_pt = step_dir / "train" / "rank0.pt"
    if not (mo / ".metadata").is_file() or not train_pt.is_file():
        raise Refused(f"'{step_dir}' is not an OLMo-core checkpoint (no model_and_optim/.metadata or "
                      "train/rank0.pt)")
    assert isinstance(oc_fs.pickle, _RestrictedPickle), "read_olmo_core runs inside restricted_loading()"
    try:
        with open(mo / ".metadata", "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Exception as e:
        raise checkpoint_problem("the checkpoint metadata", mo / ".metadata", e) from None
    if not isinstance(metadata, Metadata) or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise Refused(f"'{mo / '.metadata'}' is a {type(metadata).__name__}, not torch.distributed.checkpoint "
                      "Metadata")
    try:
        train_state = torch.load(train_pt, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        raise checkpoint_problem("the Trainer state", train_pt, e) from None
    if not isinstance(train_state, dict):
        raise Refused(f"'{train_pt}' holds a {type(train_state).__name__}, not an OLMo-core Trainer state (a dict)")

    def load(keys):
        try:
            return list(load_keys(str(mo), keys))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            raise checkpoint_problem("the checkpoint data in", mo, e) from None

    return metadata.state_dict_metadata, train_state, load


def check_close(what, ours, theirs, rel=1e-12):
    if abs(float(ours) - float(theirs)) > rel * max(abs(float(ours)), abs(float(theirs))):
        raise Refused(f"{what}: the olmoc config says {ours!r}, the OLMo-core optimizer {theirs!r}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="import_olmo_core.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("OLMO_CORE_STEP_DIR is"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step_dir", type=Path, help="OLMo-core checkpoint directory (.../stepN)")
    ap.add_argument("out_dir", type=Path, help="olmoc run directory to create step-NNNNNN/ in")
    ap.add_argument("--config", type=Path, required=True, help="the olmoc config of the continued run")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="config overrides, as for olmoc train")
    ap.add_argument("--ranks", type=int, default=1, help="data-parallel ranks the olmoc run will use (default 1)")
    ap.add_argument("--optim-init-step", choices=["auto", "yes", "no"], default="auto",
                    help="whether OLMo-core's Adam step counter is shifted by a step-0 checkpoint (see below)")
    ap.add_argument("--olmoc", type=Path, default=Path(os.environ.get("OLMOC", ROOT / "build" / "olmoc")),
                    help="the olmoc binary (default $OLMOC or build/olmoc)")
    a = ap.parse_args(argv)
    try:
        with restricted_loading():
            path = run_import(a)
    except Refused as e:
        print(f"import_olmo_core: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("import_olmo_core: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as e:  # anything unforeseen: one line, never a traceback (OLMOC_TRACEBACK=1 shows it)
        if os.environ.get("OLMOC_TRACEBACK"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"import_olmo_core: {type(e).__name__}: {first} (OLMOC_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1
    print(f"wrote {path}\ncontinue with: {a.olmoc} train {path}/config.yaml --resume")
    return 0


def run_import(a):
    import yaml

    if a.ranks < 1:
        raise Refused("--ranks must be at least 1")
    meta, ts, load = read_olmo_core(a.step_dir)
    for k in ("global_step", "global_train_tokens_seen", "data_loader"):
        if k not in ts:
            raise Refused(f"'{a.step_dir}/train/rank0.pt' has no '{k}': not an OLMo-core Trainer state")
    dl = ts["data_loader"]
    if not isinstance(dl, dict):
        raise Refused(f"'{a.step_dir}/train/rank0.pt': data_loader is a {type(dl).__name__}, not a dict")
    try:
        step = int(ts["global_step"])
        for k in ("sequence_length", "seed", "batches_processed", "tokens_processed", "epoch"):
            int(dl[k])
    except (KeyError, TypeError, ValueError) as e:
        raise Refused(f"'{a.step_dir}/train/rank0.pt': the Trainer state's global_step or data loader state is "
                      f"missing or not a number ({type(e).__name__}: {e})") from None
    if dl.get("dataset_type", "fsl") != "fsl":
        raise Refused(f"OLMo-core data loader type '{dl.get('dataset_type')}': olmoc continues only the "
                      "fixed-sequence-length (fsl) NumpyFSLDataLoader")

    # the olmoc config, with the model and the data as olmoc will open them
    out_dir = a.out_dir.resolve()
    sets = list(a.sets) + [f"data.out_dir={out_dir}"]
    yaml_text, info = olmoc_info(a.olmoc, a.config, sets, a.ranks)
    cfg = yaml.safe_load(yaml_text)
    tcfg, mcfg, dcfg = cfg["train"], cfg["model"], cfg["data"]
    if dcfg.get("order") != "olmo_core":
        raise Refused(f"data.order is '{dcfg.get('order')}': only data.order olmo_core continues OLMo-core's "
                      "batches")
    seq = int(tcfg["seq_len"])
    if int(dl["sequence_length"]) != seq:
        raise Refused(f"train.seq_len is {seq}, the OLMo-core data loader's sequence_length "
                      f"{dl['sequence_length']}")
    mt_olmo_core = int(dl.get("max_target_sequence_length") or seq)
    mt_olmoc = int(dcfg.get("max_target_sequence_length") or 0) or seq
    if mt_olmo_core != mt_olmoc:
        raise Refused(f"the OLMo-core dataset used max_target_sequence_length {mt_olmo_core}, olmoc's config "
                      f"{mt_olmoc}: set data.max_target_sequence_length={mt_olmo_core} (--set) for the same order")
    if int(dl["seed"]) != int(tcfg["seed"]):
        raise Refused(f"train.seed is {tcfg['seed']}, the OLMo-core data loader's seed {dl['seed']}")
    B = info["batch"]
    batches, tokens_epoch = int(dl["batches_processed"]), int(dl["tokens_processed"])
    if tokens_epoch != batches * B * seq:
        raise Refused(f"the OLMo-core data loader processed {tokens_epoch} tokens in {batches} batches this "
                      f"epoch, not {B} instances of {seq} tokens a batch: the olmoc global batch "
                      f"(micro_batch x grad_accum x --ranks = {B}) differs")
    epoch = int(dl["epoch"]) - 1  # OLMo-core counts epochs from 1
    pos = batches * B
    if epoch < 0 or pos > info["n_instances"]:
        raise Refused(f"OLMo-core data loader epoch {dl['epoch']}, {batches} batches: beyond the "
                      f"{info['n_instances']} instances per epoch of olmoc's data")
    tokens = int(ts["global_train_tokens_seen"])
    if tokens != (epoch * info["n_instances"] + pos) * seq:
        raise Refused(f"OLMo-core saw {tokens} tokens, but epoch {epoch + 1} at batch {batches} of olmoc's "
                      f"data ({info['n_instances']} instances an epoch) is "
                      f"{(epoch * info['n_instances'] + pos) * seq}: not the same data")

    # parameters, in olmoc's (Hugging Face) names
    names = [k[len("model."):] for k in meta if k.startswith("model.")]
    to_hf = hf_name_map(names)
    optim_keys = [k for k in meta if k.startswith("optim.")]
    if not optim_keys:
        raise Refused(f"'{a.step_dir}' holds no optimizer state")
    if any(not k.startswith(("optim.state.", "optim.param_groups.")) for k in optim_keys):
        raise Refused("the optimizer state is not in OLMo-core's flattened layout (optim.state.<param>.*)")
    for n in names:
        for s in ("exp_avg", "exp_avg_sq", "step"):
            if f"optim.state.{n}.{s}" not in meta:
                raise Refused(f"the optimizer state has no '{n}.{s}': not AdamW / SkipStepAdamW state")
    extra = {k for k in optim_keys if k.startswith("optim.state.")} - {
        f"optim.state.{n}.{s}" for n in names for s in ("exp_avg", "exp_avg_sq", "step")}
    if extra:
        raise Refused(f"unexpected optimizer state {sorted(extra)[:3]}: not AdamW / SkipStepAdamW")

    # the hyperparameters in the param groups must be olmoc's
    group_keys = sorted({k.rsplit(".", 1)[1] for k in optim_keys if k.startswith("optim.param_groups.")})
    for n in names:
        vals = dict(zip(group_keys, load([f"optim.param_groups.{n}.{g}" for g in group_keys])))
        wd = tcfg["embedding_weight_decay"] if to_hf[n] == "model.embed_tokens.weight" else tcfg["weight_decay"]
        check_close(f"weight decay of {n}", wd, vals["weight_decay"])
        check_close(f"beta1 of {n}", tcfg["beta1"], vals["betas"][0])
        check_close(f"beta2 of {n}", tcfg["beta2"], vals["betas"][1])
        check_close(f"eps of {n}", tcfg["eps"], vals["eps"])
        if "initial_lr" in vals:
            check_close(f"peak learning rate (initial_lr) of {n}", tcfg["lr"], vals["initial_lr"])
        if vals.get("amsgrad") or vals.get("maximize"):
            raise Refused(f"{n}: amsgrad / maximize AdamW is not olmoc's AdamW")
    steps = {float(v) for v in load([f"optim.state.{n}.step" for n in names])}
    if len(steps) != 1 or not float(next(iter(steps))).is_integer():
        raise Refused(f"the parameters' Adam step counters differ or are not integers: {sorted(steps)}")
    adam_step = int(next(iter(steps)))

    # the shift of Adam's step counter (see the module docstring)
    if a.optim_init_step == "auto":
        if adam_step == step + 1:
            shift = 1
        elif adam_step == step:
            shift = 0
        else:
            raise Refused(f"Adam's step counter is {adam_step} after {step} trainer steps: skipped steps or "
                          "a shifted counter cannot be told apart; pass --optim-init-step yes or no")
    else:
        shift = 1 if a.optim_init_step == "yes" else 0
    applied = adam_step - shift
    skipped = step - applied
    if applied < 0 or skipped < 0:
        raise Refused(f"Adam's step counter {adam_step} with --optim-init-step {a.optim_init_step} does not "
                      f"fit {step} trainer steps")
    if shift != (1 if tcfg.get("optim_init_step") else 0):
        sets.append(f"train.optim_init_step={'true' if shift else 'false'}")
        try:
            yaml_text, info2 = olmoc_info(a.olmoc, a.config, sets, a.ranks)
        except Refused as e:
            raise Refused(f"OLMo-core's Adam step counter is shifted by a step-0 checkpoint ({adam_step} after "
                     f"{step} steps), which needs olmoc's train.optim_init_step: {e}") from None
        assert info2 == info
    # which optimizer: torch's AdamW has param-group flags (amsgrad, foreach, ...) SkipStepAdamW has not
    kind = "adamw" if "amsgrad" in group_keys else "skip_step_adamw"
    if "optimizer" in yaml.safe_load(yaml_text)["train"]:
        if yaml.safe_load(yaml_text)["train"]["optimizer"] != kind:
            sets.append(f"train.optimizer={kind}")
            yaml_text = olmoc_info(a.olmoc, a.config, sets, a.ranks)[0]
            print(f"note: the OLMo-core optimizer is {kind}: train.optimizer set to {kind}", file=sys.stderr)
    elif kind == "skip_step_adamw":
        print("note: the OLMo-core optimizer is SkipStepAdamW; this olmoc has no train.optimizer, so the run "
              "continues with AdamW (the same updates until SkipStepAdamW would skip a step)", file=sys.stderr)
    if skipped and kind != "skip_step_adamw":
        raise Refused(f"Adam's step counter {adam_step} after {step} trainer steps would mean {skipped} skipped "
                 "steps, but the optimizer is torch's AdamW, which never skips")
    if skipped and yaml.safe_load(yaml_text)["train"].get("optimizer") != "skip_step_adamw":
        raise Refused(f"{skipped} steps were skipped (SkipStepAdamW) but this olmoc has no train.optimizer "
                 "skip_step_adamw to continue with")

    # the model shape: olmoc's parameters and their sizes
    hf_shapes = {to_hf[n]: tuple(meta[f"model.{n}"].size) for n in names}
    expect = expected_shapes(mcfg)
    if set(hf_shapes) != set(expect):
        missing, unknown = sorted(set(expect) - set(hf_shapes)), sorted(set(hf_shapes) - set(expect))
        raise Refused(f"the OLMo-core model does not have the config's layers: missing {missing[:3]}, "
                      f"not in the config {unknown[:3]}")
    for k, shape in expect.items():
        if hf_shapes[k] != shape:
            raise Refused(f"{k} is {list(hf_shapes[k])} in the OLMo-core checkpoint but {list(shape)} by "
                          "the config's model section")

    # write
    final = out_dir / f"step-{step:06d}"
    tmp = out_dir / f".tmp-step-{step:06d}"
    if final.exists():
        raise Refused(f"'{final}' already exists")
    out_dir.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()

    def tensor(key):
        return lambda: load([key])[0].detach().to("cpu").float().numpy()

    order = sorted(names, key=lambda n: to_hf[n])
    write_safetensors(tmp / "model.safetensors",
                      [(to_hf[n], "F32", hf_shapes[to_hf[n]], tensor(f"model.{n}")) for n in order])
    entries = []
    for n in order:
        for s in ("exp_avg", "exp_avg_sq"):
            entries.append((f"{to_hf[n]}.{s}", "F32", hf_shapes[to_hf[n]], tensor(f"optim.state.{n}.{s}")))
    entries.append(("step", "I64", (1,), lambda: np.array([applied], dtype=np.int64)))
    write_safetensors(tmp / "optim.safetensors", entries)
    (tmp / "config.yaml").write_text(yaml_text)
    files = {}
    for name in ("model.safetensors", "optim.safetensors", "config.yaml"):
        h, size = hash64_file(tmp / name)
        files[name] = {"bytes": size, "hash64": f"{h:016x}"}
    state = {"format": CKPT_FORMAT, "version": CKPT_VERSION, "hash": HASH_NAME, "step": step, "tokens": tokens,
             "elapsed_s": 0}
    if skipped:
        state["skipped_steps"] = skipped
    state["loader"] = {"train_path": yaml.safe_load(yaml_text)["data"].get("train_path", ""),
                       "seed": str(int(tcfg["seed"])), "epoch": epoch, "pos": pos,
                       "n_instances": info["n_instances"], "fingerprint": str(info["fingerprint"])}
    state["files"] = files
    state["imported_from"] = {"olmo_core_checkpoint": str(a.step_dir.resolve()), "adam_step": adam_step}
    (tmp / "state.json").write_text(json.dumps(state, indent="\t"))
    for p in tmp.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    os.rename(tmp, final)
    fd = os.open(out_dir, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return final


def expected_shapes(m):
    """olmoc's parameters (Hugging Face Olmo3 names) and shapes for a config's model section."""
    d, h, kv = int(m["d_model"]), int(m["n_heads"]), int(m["n_kv_heads"])
    hd = d // h
    v, f = int(m["vocab_size"]), int(m["mlp_hidden"])
    out = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(int(m["n_layers"])):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                    p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
                    p + "self_attn.q_norm.weight": (h * hd,), p + "self_attn.k_norm.weight": (kv * hd,),
                    p + "post_attention_layernorm.weight": (d,), p + "post_feedforward_layernorm.weight": (d,),
                    p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                    p + "mlp.down_proj.weight": (d, f)})
    return out


if __name__ == "__main__":
    sys.exit(main())
