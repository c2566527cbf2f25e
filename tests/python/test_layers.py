"""scripts/check_layers.py: the includes of src/ only point down the layer order of
docs/architecture.md, and the check fails, naming the file, the line and the two layers,
when one points up or sideways (planted in a copy of src/)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def check(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def test_src_includes_only_point_down():
    rc, out = check()
    assert rc == 0, out
    assert "includes only point down" in out


@pytest.fixture
def src_copy(tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(ROOT / "src", dst)
    return dst


def plant(path, line):
    """Appends an include to path; returns its line number."""
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + line + "\n")
    return text.count("\n") + 1


@pytest.mark.parametrize("where, include, layers", [
    ("util/error.c", '#include "train/run.h"', "util -> train"),
    ("model/model.h", '#  include "optim/optim.h" /* comment */', "model -> optim"),
    ("dist/dist.c", '#include "../backend/backend.h"', "dist -> backend"),
    ("config/config.c", '#include "io/safetensors.h"', "config -> io"),  # sideways: one row
])
def test_planted_upward_include_fails(src_copy, where, include, layers):
    line = plant(src_copy / where, include)
    rc, out = check("--src", src_copy)
    assert rc == 1, out
    assert f"src/{where}:{line}: {layers}:" in out, out


def test_downward_include_passes(tmp_path):
    # a tree of its own, so that the result does not depend on the state of src/
    for rel, text in {
        "util/a.h": "#include <stdio.h>\n",
        "config/c.h": '#include "util/a.h"\n#include "c2.h"\n',
        "train/t.c": '#include "train/t.h"\n#include "model/m.h"\n#include "util/a.h"\n#include <yaml.h>\n',
        "model/m.h": '#include "config/c.h"\n#include "backend/cuda/x.h"\n',
        "backend/cuda/x.h": '#include "dist/d.h"\n',
    }.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text(text)
    rc, out = check("--src", tmp_path / "src", "--doc", "")
    assert rc == 0, out
    plant(tmp_path / "src" / "util" / "a.h", '#include "backend/cuda/x.h"')
    rc, out = check("--src", tmp_path / "src", "--doc", "")
    assert rc == 1 and "src/util/a.h:2: util -> backend:" in out, out


def test_unplaced_directory_fails(src_copy):
    (src_copy / "serve").mkdir()
    (src_copy / "serve" / "s.c").write_text('#include "model/model.h"\n')
    rc, out = check("--src", src_copy)
    assert rc == 1 and "src/serve: layer 'serve' is not in the layer order" in out, out


def test_doc_picture_must_match(tmp_path):
    doc = (ROOT / "docs" / "architecture.md").read_text()
    swapped = doc.replace("\noptim/ ", "\nOPTIM\n", 1).replace("\nmodel/ ", "\noptim/ ", 1).replace("\nOPTIM\n", "\nmodel/ ", 1)
    assert swapped != doc
    (tmp_path / "architecture.md").write_text(swapped)
    rc, out = check("--doc", tmp_path / "architecture.md")
    assert rc == 1 and "differs from scripts/check_layers.py's order" in out, out
