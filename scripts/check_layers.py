#!/usr/bin/env python3
"""Checks that the includes of src/ only point down the layer order.

Every `#include "x/..."` in a source file under src/<layer>/ must name the
same layer or one in a lower row of LAYERS; an include of a layer in a higher
row, or of another layer in the same row, is reported as FILE:LINE with the
two layers, and the exit status is 1.  A directory of src/ that is not in
LAYERS is an error too (a new layer is placed here first).  The picture in
docs/architecture.md (its "## Layers" block) must list the same rows in the
same order; it is checked as well unless --doc '' is given.

    scripts/check_layers.py [--src DIR] [--doc FILE]
"""
import argparse
import os
import re
import sys

# The layer order, top to bottom; the layers of one row do not include each other.
LAYERS = [
    ["cli"],
    ["train"],
    ["eval"],
    ["optim"],
    ["model"],
    ["data"],
    ["backend"],
    ["dist"],
    ["tokenizer"],
    ["config", "io"],
    ["util"],
]

SOURCE_EXTS = (".c", ".h", ".cu", ".cuh", ".cc", ".cpp", ".hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def row_of():
    return {layer: i for i, row in enumerate(LAYERS) for layer in row}


def include_layer(src, path, target, layers):
    """The layer an include names: "x/..." from src/, or a relative path that leaves its directory."""
    first = target.split("/", 1)[0]
    if "/" in target and not target.startswith("."):
        return first if (first in layers or os.path.isdir(os.path.join(src, first))) else None
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    rel = os.path.relpath(resolved, src)
    if rel.startswith(".."):
        return None
    return rel.split(os.sep, 1)[0]


def check_src(src):
    rows = row_of()
    problems = []
    for name in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, name)) and name not in rows:
            problems.append(f"{os.path.join(os.path.basename(os.path.abspath(src)), name)}: layer '{name}' is not in the layer order (scripts/check_layers.py)")
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(SOURCE_EXTS):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, src)
            shown = os.path.relpath(path, os.path.dirname(os.path.abspath(src)))  # src/<layer>/...
            if os.sep not in rel:
                continue  # a file directly in src/ belongs to no layer
            layer = rel.split(os.sep, 1)[0]
            if layer not in rows:
                continue  # reported above
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = include_layer(src, path, m.group(1), rows)
                    if target is None or target == layer:
                        continue
                    if target not in rows:
                        problems.append(f"{shown}:{lineno}: {layer} -> {target}: '{target}' is not a layer ({m.group(1)})")
                    elif rows[target] < rows[layer]:
                        problems.append(f"{shown}:{lineno}: {layer} -> {target}: includes a layer above it ({m.group(1)})")
                    elif rows[target] == rows[layer]:
                        problems.append(f"{shown}:{lineno}: {layer} -> {target}: includes a layer beside it ({m.group(1)})")
    return problems


def doc_rows(doc):
    """The rows of the picture in doc's "## Layers" section: each line's leading "name/" words."""
    with open(doc, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Layers\n(.*?)^```\n(.*?)^```", text, re.S | re.M)
    if not m:
        return None
    rows = []
    for line in m.group(2).splitlines():
        row = []
        for word in line.split():
            if not word.endswith("/"):
                break
            row.append(word[:-1])
        if row:
            rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.join(ROOT, "src"), help="the source tree (default: src/)")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "architecture.md"),
                    help="the document whose layer picture must match ('' = skip)")
    args = ap.parse_args()
    if not os.path.isdir(args.src):
        print(f"check_layers: no directory {args.src}", file=sys.stderr)
        return 2
    problems = check_src(args.src)
    if args.doc:
        rows = doc_rows(args.doc)
        if rows is None:
            problems.append(f"{args.doc}: no layer picture (a ``` block under '## Layers')")
        elif rows != LAYERS:
            show = lambda rs: " > ".join("/".join(r) for r in rs)
            problems.append(f"{args.doc}: the layer picture ({show(rows)}) differs from scripts/check_layers.py's "
                            f"order ({show(LAYERS)})")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) or layer(s) out of order", file=sys.stderr)
        return 1
    print(f"check_layers: includes only point down ({' > '.join('/'.join(r) for r in LAYERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
