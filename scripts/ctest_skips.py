#!/usr/bin/env python3
"""Prints why each skipped ctest test was skipped.

ctest shows a test's output only when it fails, so the line a test prints
before it exits 77 (SKIP_RETURN_CODE) would not appear.  This reads the JUnit
file of `ctest --output-junit FILE` and prints, for every skipped test, its
name and the last line of its output that starts with "SKIP:".  A skipped
test that printed no such line is an error (exit status 1): every test that
can exit 77 says why first.

    scripts/ctest_skips.py JUNIT.xml
"""
import sys
import xml.etree.ElementTree as ET


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    silent = []
    for case in ET.parse(argv[1]).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        out = case.findtext("system-out") or ""
        reasons = [line.strip() for line in out.splitlines() if line.strip().startswith("SKIP:")]
        if reasons:
            print(f"   skipped {case.get('name')}: {reasons[-1][len('SKIP:'):].strip()}")
        else:
            silent.append(case.get("name"))
    for name in silent:
        print(f"ctest_skips.py: {name} was skipped and printed no 'SKIP: <reason>' line", file=sys.stderr)
    return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
