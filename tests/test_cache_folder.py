"""The per-user cache folder, by platform and environment."""

import sys
from pathlib import Path

import pytest

from sklocus._cache_folder import user_cache_folder


@pytest.fixture
def home(monkeypatch, tmp_path):
    """A home folder of the test's own, with no cache variable set."""
    for variable in ("SKLOCUS_HOME", "XDG_CACHE_HOME", "LOCALAPPDATA"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("USERPROFILE", str(tmp_path))
    return tmp_path


def test_sklocus_home_comes_first(home, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    monkeypatch.setenv("SKLOCUS_HOME", str(home / "mine"))
    assert user_cache_folder() == home / "mine"


@pytest.mark.skipif(sys.platform in ("win32", "darwin"), reason="Linux convention")
def test_linux_follows_xdg_cache_home(home, monkeypatch):
    assert user_cache_folder() == home / ".cache" / "sklocus"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    assert user_cache_folder() == home / "xdg" / "sklocus"
    # The XDG specification says to ignore a relative path.
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert user_cache_folder() == home / ".cache" / "sklocus"


def test_macos_and_windows_use_their_own_folders(home, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert user_cache_folder() == home / "Library" / "Caches" / "sklocus"
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(home / "Local"))
    assert user_cache_folder() == Path(home / "Local" / "sklocus" / "Cache")
