from rlanything.paths import cache_dir


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLANYTHING_CACHE", str(tmp_path / "a" / "b"))
    assert cache_dir() == tmp_path / "a" / "b" and cache_dir().is_dir()
