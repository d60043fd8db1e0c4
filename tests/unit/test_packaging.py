"""What ``pip install fastps`` and its extras bring (pyproject.toml), against what the
commands need: ``fastpsrun --progress`` works after the plain install (rich is a base
dependency, docs/design/dependencies.md says why); ``python -m fastps.timeline summarize --plot``
names the ``plot`` extra, which brings matplotlib."""

from __future__ import annotations

import re
from typing import Dict, List

from wheel_layout import pyproject

PROJECT = pyproject()["project"]


def _names(requirements: List[str]) -> Dict[str, str]:
    """Distribution name (normalised) -> the requirement naming it."""
    return {re.split(r"[\s\[<>=!~;@]", r, maxsplit=1)[0].lower(): r for r in requirements}


def test_the_progress_line_needs_nothing_beyond_the_plain_install() -> None:
    base = _names(PROJECT["dependencies"])
    assert "rich" in base, PROJECT["dependencies"]


def test_existing_progress_extra_installs_still_resolve() -> None:
    assert "rich" in _names(PROJECT["optional-dependencies"]["progress"])


def test_the_plot_extra_brings_matplotlib() -> None:
    extras = PROJECT["optional-dependencies"]
    assert "matplotlib" in _names(extras["plot"]), extras.get("plot")
    assert "matplotlib" not in _names(PROJECT["dependencies"])  # optional: --plot only


def test_config_files_and_fastps_run_need_nothing_beyond_the_plain_install() -> None:
    """``fastpsrun --config-file`` reads YAML; ``fastps.run()`` sends functions from
    ``__main__`` by value."""
    base = _names(PROJECT["dependencies"])
    assert {"pyyaml", "cloudpickle"} <= set(base), PROJECT["dependencies"]
