"""Headless Chromium for the dashboard tests, driven by its command line: the DOM after the page's scripts ran, and
screenshots.

Debian's `chromium` (`scripts/ensure-tool.sh --install chromium chromium` installs it). Without it the tests that need
it skip, except under CI=true, where they fail instead so that CI cannot pass without running them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome")
FIX_LINE = "install Chromium: scripts/ensure-tool.sh --install chromium chromium (Debian's chromium package)"
# --virtual-time-budget: virtual milliseconds the page runs before the DOM is taken; virtual time stands still while
# a fetch is in flight, so the page's first /api/state answer is always rendered within it
BUDGET_MS = 5000


@dataclass(frozen=True)
class Chromium:
    binary: str

    def _run(self, url: str, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
            command = [
                self.binary, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
                "--mute-audio", f"--user-data-dir={profile}", f"--virtual-time-budget={BUDGET_MS}", *flags, url,
            ]  # fmt: skip
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-3000:]}"
        return result

    def dom(self, url: str) -> str:
        """The page's DOM as HTML after its scripts ran."""
        return self._run(url, "--dump-dom").stdout

    def screenshot(self, url: str, path: Path, *, width: int = 1400, height: int = 1200) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(url, f"--screenshot={path}", f"--window-size={width},{height}")
        assert path.is_file() and path.stat().st_size > 1000, f"no screenshot at {path}"
        return path


def find_chromium() -> str | None:
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def require_chromium() -> Chromium:
    """The browser, or a skip (a failure under CI=true) naming how to install it."""
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires headless Chromium: {FIX_LINE}")
        pytest.skip(f"no Chromium on PATH: {FIX_LINE}")
    return Chromium(binary)


def text(html: str) -> str:
    """The visible text of an HTML fragment, whitespace collapsed."""
    without_tags = re.sub(r"<[^>]+>", " ", html)
    return " ".join(unescape(without_tags).split())


def element_text(dom: str, element_id: str) -> str:
    """The text of the element with this id (a `dd` or `td` that holds no element of its own tag)."""
    found = re.search(rf'<(\w+)[^>]*\bid="{re.escape(element_id)}"[^>]*>(.*?)</\1>', dom, re.S)
    assert found, f"no element #{element_id} in the page:\n{text(dom)[:3000]}"
    return text(found.group(2))


def row_text(dom: str, work_key: str) -> str:
    """The text of the table row of this work key."""
    found = re.search(rf'<tr data-work-key="{re.escape(work_key)}">(.*?)</tr>', dom, re.S)
    assert found, f"no row for {work_key} in the page:\n{text(dom)[:3000]}"
    return text(found.group(1))
