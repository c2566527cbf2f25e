"""Live tracking of an olmoc run in Weights & Biases and/or TensorBoard.

    python scripts/track.py RUN_DIR --wandb PROJECT[/NAME] [--tensorboard DIR] [--once]

Follows RUN_DIR/metrics.jsonl while the run goes (as tail -f: new lines as
they are written, the file cut or rewritten by a resumed run read again) and
sends its train, eval and downstream records under OLMo-core's metric names
(train/CE loss, optim/LR (group 0), throughput/device/TPS, eval/lm/SET/CE loss,
eval/downstream/TASK (accuracy), ...: docs/tracking.md), at the run's step.
It exits once the run has written its last step's records and released the
run directory (its lock), on Ctrl-C, or, with --once, after sending what the
file holds.

Each sink keeps a state file (RUN_DIR/.track/SINK-HASH.json: the W&B run id,
the last step sent and the records sent at that step), so neither a resumed
run (which writes again the records of the steps after its checkpoint) nor a
restarted tracker sends a step twice or skips one: a record is sent when its
step is past the last step sent, or at that step when it was not sent yet.
A restarted tracker resumes the same W&B run (resume="allow" with the stored
id; W&B ignores a step below the run's current one), and in TensorBoard sends
the last step again after a SessionLog START at that step, so TensorBoard drops
whatever an earlier tracker wrote from that step on, even what a killed one
sent but had not saved in its state.  WANDB_MODE=offline works (wandb sync
uploads the run later).
"""
import argparse
import fcntl
import hashlib
import json
import math
import os
import pathlib
import re
import secrets
import signal
import string
import sys
import time

# OLMo-core's DownstreamEvaluator.metric_type_to_label
DOWNSTREAM_LABELS = {
    "f1_v1": "F1 score", "acc_v1": "accuracy", "len_norm_v1": "length-normalized accuracy",
    "pmi_dc_v1": "PMI-DC accuracy", "ce_loss_v1": "CE loss", "bpb_v1": "BPB", "soft_v1": "soft loss",
    "soft_log_v1": "log soft loss", "f1_v2": "F1 score v2", "acc_v2": "accuracy v2",
    "len_norm_v2": "length-normalized accuracy v2", "pmi_dc_v2": "PMI-DC accuracy v2", "ce_loss_v2": "CE loss v2",
    "bpb_v2": "BPB v2", "soft_v2": "soft loss v2", "soft_log_v2": "log soft loss v2",
    # olmoc's multiple-choice tasks of token ids (olmoc eval's acc / acc_per_token)
    "acc": "accuracy", "acc_per_token": "accuracy per token",
}
GIB = float(1 << 30)


def fail(msg):
    raise SystemExit(f"track: {msg}")


def number(v):
    """A finite float, or None (olmoc writes null for a value that is not finite)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def metrics_of(rec):
    """The OLMo-core metric names and values of one metrics.jsonl record ({} for a type it does not know)."""
    kind, out = rec.get("type"), {}

    def put(name, v):
        v = number(v)
        if v is not None:
            out[name] = v

    if kind == "train":
        put("train/CE loss", rec.get("loss"))
        loss = number(rec.get("loss"))
        if loss is not None and loss < 700:
            put("train/PPL", math.exp(loss))
        put("train/Z loss", rec.get("z_loss"))
        put("optim/total grad norm", rec.get("grad_norm"))
        put("optim/LR (group 0)", rec.get("lr"))
        put("optim/step skipped", 1.0 if rec.get("skipped") else 0.0)
        put("throughput/total tokens", rec.get("tokens"))
        put("throughput/device/TPS", rec.get("tokens_per_s_per_device", rec.get("tokens_per_s")))
        mfu = number(rec.get("mfu"))
        if mfu is not None:
            put("throughput/device/MFU", 100.0 * mfu)  # OLMo-core's MFU is a percentage
        peaks = [number(p) for p in rec.get("mem_peak_bytes") or []]
        peaks = [p for p in peaks if p is not None]
        if peaks:
            put("gpu_memory/GPU active mem (GiB)", max(peaks) / GIB)
            if len(peaks) > 1:
                for r, p in enumerate(peaks):
                    put(f"gpu_memory/rank {r} active mem (GiB)", p / GIB)
    elif kind == "eval":
        named = rec.get("metrics")
        if isinstance(named, dict):  # OLMo-core's own names, written by olmoc (eval/lm/SET/CE loss, PPL)
            for k, v in named.items():
                put(str(k), v)
        else:
            put(f"eval/lm/{rec.get('set')}/CE loss", rec.get("loss"))
            put(f"eval/lm/{rec.get('set')}/PPL", rec.get("ppl"))
        if "bpb" in rec:
            put(f"eval/lm/{rec.get('set')}/BPB", rec.get("bpb"))
    elif kind == "downstream":
        for k, label in DOWNSTREAM_LABELS.items():
            if k in rec:
                put(f"eval/downstream/{rec.get('task')} ({label})", rec[k])
    return out


def parse_record(raw):
    """One line of metrics.jsonl; an older olmoc wrote a value that is not finite as a bare nan or inf."""
    try:
        return json.loads(raw)
    except ValueError:
        return json.loads(re.sub(rb"(?<=:)-?(?:nan|inf)(?=[,}])", b"null", raw))


def record_key(rec):
    """What tells the records of one step apart: the type and its set or task."""
    return f"{rec.get('type')}:{rec.get('set', rec.get('task', ''))}"


class State:
    """The last step a sink got and the records of that step it got, in an atomically replaced JSON file."""

    def __init__(self, path, target):
        self.path, self.data = path, {"target": target, "step": 0, "sent_at_step": [], "extra": {}}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                fail(f"{path}: unreadable state ({e}); move it away to send everything again")
            if data.get("target") != target:
                fail(f"{path} belongs to {data.get('target')!r}, not {target!r}")
            self.data.update(data)
        self.sent = set(self.data["sent_at_step"])

    @property
    def step(self):
        return self.data["step"]

    def wants(self, step, key):
        return step > self.step or (step == self.step and key not in self.sent)

    def mark(self, step, key):
        if step > self.step:
            self.data["step"], self.sent = step, set()
        self.sent.add(key)

    def save(self):
        self.data["sent_at_step"] = sorted(self.sent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, self.path)


class WandbSink:
    def __init__(self, spec, run_dir, config, state, wandb_dir):
        import wandb
        project, _, name = spec.partition("/")
        if not project:
            fail(f"--wandb {spec!r}: give PROJECT or PROJECT/NAME")
        extra = state.data["extra"]
        extra.setdefault("run_id", "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8)))
        state.save()
        self.run = wandb.init(project=project, name=name or run_dir.name, id=extra["run_id"], resume="allow",
                              config=config, dir=str(wandb_dir) if wandb_dir else None)

    def set_config(self, config):
        self.run.config.update(config, allow_val_change=True)

    def send(self, step, metrics):
        # records of one step go to one W&B step (OLMo-core's WandBCallback logs at the trainer's step)
        self.run.log(metrics, step=step)

    def flush(self):
        pass

    def close(self):
        self.run.finish()


class TensorBoardSink:
    def __init__(self, logdir, state):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.event_pb2, self.summary_pb2 = event_pb2, summary_pb2
        self.writer = EventFileWriter(str(logdir), flush_secs=5)
        self.started = False
        # A restart sends the records of the last step again, after a SessionLog START at the first step it
        # sends: TensorBoard then drops every event of that step or later from the earlier files (its
        # purge_orphaned_data), so a step is never shown twice, even one a killed tracker sent but had not
        # yet saved in its state.
        state.sent = set()

    def send(self, step, metrics):
        ev, pb = self.event_pb2, self.summary_pb2
        if not self.started:
            self.writer.add_event(ev.Event(wall_time=time.time(), step=step,
                                           session_log=ev.SessionLog(status=ev.SessionLog.START)))
            self.started = True
        values = [pb.Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        self.writer.add_event(ev.Event(wall_time=time.time(), step=step, summary=pb.Summary(value=values)))

    def flush(self):
        self.writer.flush()

    def close(self):
        self.writer.close()


class Follower:
    """Complete lines of metrics.jsonl as they appear; starts again from the top when the file is cut or replaced."""

    def __init__(self, path):
        self.path, self.f, self.ino, self.pos, self.partial = path, None, None, 0, b""

    def lines(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self.f is None or st.st_ino != self.ino or st.st_size < self.pos:
            if self.f:
                self.f.close()
            self.f, self.ino, self.pos, self.partial = open(self.path, "rb"), st.st_ino, 0, b""
        self.f.seek(self.pos)
        data = self.f.read()
        self.pos += len(data)
        data = self.partial + data
        *done, self.partial = data.split(b"\n")
        return done


def run_finished(run_dir):
    """No process holds the run's lock (olmoc train holds an exclusive flock on RUN_DIR/.lock while it runs)."""
    try:
        fd = os.open(run_dir / ".lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def read_config(run_dir):
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    import yaml
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        fail(f"{path}: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=pathlib.Path, help="the run's data.out_dir (holding metrics.jsonl)")
    ap.add_argument("--wandb", metavar="PROJECT[/NAME]", help="W&B project and run name (default name: RUN_DIR's)")
    ap.add_argument("--wandb-dir", type=pathlib.Path, help="where wandb keeps its files (default: wandb's, $WANDB_DIR)")
    ap.add_argument("--tensorboard", metavar="DIR", type=pathlib.Path, help="TensorBoard log directory")
    ap.add_argument("--once", action="store_true", help="send what metrics.jsonl holds now and exit")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between looks at the file (default 1)")
    ap.add_argument("--state-dir", type=pathlib.Path, help="where the state files go (default RUN_DIR/.track)")
    args = ap.parse_args(argv)
    if not args.wandb and not args.tensorboard:
        ap.error("give --wandb PROJECT[/NAME] and/or --tensorboard DIR")
    run_dir = args.run_dir.resolve()
    if not run_dir.is_dir():
        fail(f"{args.run_dir} is not a directory")
    state_dir = args.state_dir or run_dir / ".track"
    config = read_config(run_dir)

    sinks = []  # (sink, state)
    targets = []
    if args.tensorboard:
        targets.append(("tensorboard", str(args.tensorboard.resolve())))
    if args.wandb:
        targets.append(("wandb", args.wandb))
    for kind, target in targets:
        digest = hashlib.sha1(f"{kind}:{target}".encode()).hexdigest()[:12]
        state = State(state_dir / f"{kind}-{digest}.json", f"{kind}:{target}")
        sink = (TensorBoardSink(pathlib.Path(target), state) if kind == "tensorboard"
                else WandbSink(target, run_dir, config, state, args.wandb_dir))
        sinks.append((sink, state))

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    path = run_dir / "metrics.jsonl"
    follower, sent = Follower(path), 0

    def process(lines):
        nonlocal sent
        if not lines:  # nothing new to send or to record (the state is saved at the end too)
            return
        for raw in lines:
            try:
                rec = parse_record(raw)
                step = int(rec["step"])
            except (ValueError, KeyError, TypeError):
                fail(f"{path}: a line that is not a metrics record: {raw[:200]!r}")
            key, metrics = record_key(rec), metrics_of(rec)
            for sink, state in sinks:
                if state.wants(step, key):
                    if metrics:
                        sink.send(step, metrics)
                        sent += 1
                    state.mark(step, key)
        for sink, state in sinks:  # what the state says was sent is in the sink first
            sink.flush()
            state.save()

    try:
        while True:
            lines = follower.lines()
            process(lines)
            if args.once or stop:
                break
            current = read_config(run_dir)
            if current and not config:  # the run wrote config.yaml after the tracker started
                config = current
                for sink, _ in sinks:
                    if isinstance(sink, WandbSink):
                        sink.set_config(config)
            steps = (current.get("train") or {}).get("steps")
            last = isinstance(steps, int) and steps > 0 and all(state.step >= steps for _, state in sinks)
            if last and not lines and run_finished(run_dir):
                process(follower.lines())  # what the run wrote before it let go of its lock
                break
            time.sleep(args.poll)
    except KeyboardInterrupt:
        pass
    finally:
        for sink, state in sinks:
            sink.flush()
            state.save()
            sink.close()
    print(f"track: {sent} records sent; last step {max((s.step for _, s in sinks), default=0)}", file=sys.stderr)


if __name__ == "__main__":
    main()
