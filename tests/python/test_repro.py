"""The reproduction study's short variant: olmoc and PyTorch train Olmo 3's
two-stage recipe (40 + 15 steps) from the same weights on the same batches
and must agree within the study's thresholds (repro/report.py)."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
    assert (tmp_path / "curves.png").stat().st_size > 10000
