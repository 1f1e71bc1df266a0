#!/usr/bin/env python3
"""Prints "passed failed skipped" test-case counts from one Catch2 test log (Bazel's test.log).

Catch2 ends its console output with either
  All tests passed (N assertions in M test cases)
or
  test cases: T | P passed | F failed     (a column that is 0 is left out)
A log holding several such summaries (one per rank of a multi-rank test) adds them.
A test case that cannot run here (Catch2 v2 has no SKIP) issues the warning "SKIPPED: <why>"
and returns; Catch2 counts it as passed, and it is counted here as skipped instead.
Prints nothing if the log has no summary.
"""
import re
import sys

text = open(sys.argv[1], errors="replace").read()
passed = failed = 0
found = False
for m in re.finditer(r"All tests passed \(\d+ assertions? in (\d+) test cases?\)", text):
    passed += int(m.group(1))
    found = True
for m in re.finditer(r"test cases:\s+(\d+)(?: \|\s+(\d+) passed)?(?: \|\s+(\d+) failed)?", text):
    total, p, f = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    passed += int(p) if p is not None else total - f
    failed += f
    found = True
skipped = len(re.findall(r"warning:\s*\n\s+SKIPPED: ", text))
if found:
    print(passed - skipped, failed, skipped)
