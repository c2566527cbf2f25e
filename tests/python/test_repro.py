"""The reproduction study's short variant: olmoc and OLMo-core's own model,
optimizer, schedulers and data loader (repro/olmo_core_train.py) train Olmo 3's
two-stage recipe (40 + 15 steps, Stage 2 from Stage 1's weights and optimizer
state) from the same weights on the same batches (the OLMo-core side checks
every batch against olmoc's) and must agree within the study's thresholds
(repro/report.py); the report shows each difference next to two more OLMo-core
runs' (threads and micro-batch split only; the clipping norm summed in float64)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_study_agrees(build_dir, tmp_path):
    if not (ROOT / "data/demo/corpus.jsonl").exists():
        subprocess.run([sys.executable, ROOT / "scripts/make_demo_data.py", "--olmoc", build_dir / "olmoc"],
                       check=True, capture_output=True)
    r = subprocess.run([sys.executable, ROOT / "repro/run_study.py", "--quick", "--out", tmp_path,
                        "--olmoc", build_dir / "olmoc"], capture_output=True, text=True,
                       env=dict(os.environ, OMP_WAIT_POLICY="passive"), timeout=900)
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + report
    assert "**Overall: PASS**" in report and "FAIL" not in report
    steps = sum(1 for s in (1, 2) for line in open(tmp_path / f"c-stage{s}" / "metrics.jsonl")
                if json.loads(line)["type"] == "train")
    assert steps >= 50
    # the noise reference ran and its differences are reported next to olmoc's
    for run in ("b", "c"):
        assert f"OLMo-core ({run}) vs OLMo-core (noise)" in report
        for s in (1, 2):
            rows = [json.loads(line) for line in open(tmp_path / f"olmo_core-{run}-stage{s}" / "metrics.jsonl")]
            assert sum(r["type"] == "train" for r in rows) == sum(
                json.loads(line)["type"] == "train" for line in open(tmp_path / f"c-stage{s}" / "metrics.jsonl"))
    # olmoc within the reference's own noise: its mean per-step training-loss difference from OLMo-core at
    # most 10 times the larger noise run's (measured 0.97x and 0.67x; a lost Adam step in Stage 2's
    # bias correction measured 360x while passing the 1% threshold), and from OLMo-core (c), which sums the
    # clipping norm as olmoc does, at most 10 times run (b)'s (measured 0.97x, 0.73x)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for s in (1, 2):
        ours, noise = summary[f"stage{s}"]["train_rel_diff_mean"]
        assert ours <= 10 * noise, (s, ours, noise)
        vs_c = summary[f"stage{s}"]["olmoc_vs_c"]["train_rel_diff_mean"]
        noise_b = summary[f"stage{s}"]["noise_runs"]["olmo_core-b"]["train_rel_diff_mean"]
        assert vs_c <= 10 * noise_b, (s, vs_c, noise_b)
    # Stage 2 continued Adam's step: OLMo-core's loaded optimizer state
    import torch
    st = torch.load(tmp_path / "olmo_core-stage2" / "state.pt", weights_only=True)["optim"]["state"]
    assert all(float(v["step"]) == 1 + 40 + 15 for v in st.values())
    assert (tmp_path / "curves.png").stat().st_size > 10000
