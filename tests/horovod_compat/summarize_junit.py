"""Counts passed/failed/errored/skipped tests in JUnit XML reports (one per rank)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def summarize(path: str) -> tuple[dict, list]:
    """One outcome per test: pytest writes a second entry for an error in teardown, which
    turns a passed test into an error and leaves a failed one failed."""
    outcome: dict = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        name = case.get("name", "?")
        if "failure" in kinds:
            kind = "failed"
        elif "error" in kinds:
            kind = "error"
        elif "skipped" in kinds:
            kind = "skipped"
        else:
            kind = "passed"
        rank = ["passed", "skipped", "error", "failed"]
        if name not in outcome or rank.index(kind) > rank.index(outcome[name]):
            outcome[name] = kind
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for kind in outcome.values():
        counts[kind] += 1
    failures = sorted(n for n, k in outcome.items() if k in ("failed", "error"))
    return counts, failures


def main(paths: list) -> int:
    if not paths:
        print("no reports (did a rank crash before pytest finished?)")
        return 1
    first_failures = None
    for path in sorted(paths):
        counts, failures = summarize(path)
        total = sum(counts.values())
        print(
            f"{path}: {counts['passed']}/{total} passed, {counts['failed']} failed, "
            f"{counts['error']} errors, {counts['skipped']} skipped"
        )
        if first_failures is None:
            first_failures = failures
    for name in first_failures or []:
        print(f"  not passed: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
