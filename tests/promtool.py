"""promtool, Prometheus's own checker, reads our `/metrics` pages: what a Prometheus server would scrape must parse
and pass its lint (names, HELP and TYPE lines, counters ending in `_total`). Debian's prometheus package holds it
(`scripts/ensure-tool.sh --install prometheus promtool`). Without it the tests that need it skip, except under
CI=true, where they fail instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request

import pytest

FIX_LINE = "install promtool: scripts/ensure-tool.sh --install prometheus promtool (Debian's prometheus package)"


def check_metrics(page: str) -> None:
    """`promtool check metrics` passes `page` without a complaint."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires promtool: {FIX_LINE}")
        pytest.skip(f"no promtool on PATH: {FIX_LINE}")
    result = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=30)
    complaints = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not complaints, f"promtool exited {result.returncode}: {complaints}\n{page}"


def fetch_page(url: str) -> str:
    """A `/metrics` page as a scraper gets it; its Content-Type must be the text format's."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        page: str = response.read().decode("utf-8")
        return page
