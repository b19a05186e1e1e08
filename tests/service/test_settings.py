from __future__ import annotations

import pytest

from autopar.errors import ConfigError
from autopar_service.settings import Settings, load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AUTOPAR_REDIS_URL", "AUTOPAR_API_KEYS"):
        monkeypatch.delenv(name, raising=False)
    s = load_settings()
    assert s.redis_url is None and not s.uses_redis
    assert s.api_keys == []
    assert s.max_body_bytes == 64 * 1024**2
    assert s.max_compressed_body_bytes == 64 * 1024**2


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AUTOPAR_REDIS_URL", "redis://cache:6379/1")
    monkeypatch.setenv("AUTOPAR_API_KEYS", " alpha, beta ,,")
    monkeypatch.setenv("AUTOPAR_LOCAL_WORKERS", "3")
    monkeypatch.setenv("AUTOPAR_CACHE_DIR", str(tmp_path))
    s = load_settings()
    assert s.uses_redis and s.redis_url == "redis://cache:6379/1"
    assert s.api_keys == ["alpha", "beta"]
    assert s.local_workers == 3
    assert s.cache_dir == tmp_path


def test_empty_redis_url_means_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPAR_REDIS_URL", "  ")
    assert load_settings().redis_url is None


@pytest.mark.parametrize(
    ("env", "value", "names"),
    [
        ("AUTOPAR_REDIS_URL", "http://localhost:6379", "AUTOPAR_REDIS_URL"),
        ("AUTOPAR_LOCAL_WORKERS", "0", "AUTOPAR_LOCAL_WORKERS"),
        ("AUTOPAR_MAX_BODY_BYTES", "-5", "AUTOPAR_MAX_BODY_BYTES"),
        ("AUTOPAR_JOB_RETRIES", "many", "AUTOPAR_JOB_RETRIES"),
    ],
)
def test_invalid_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, names: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.code == "bad_settings"
    assert names in info.value.message


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match="default_time_limit_s"):
        load_settings(default_time_limit_s=100, max_time_limit_s=10)
    with pytest.raises(ConfigError, match="worker_lost_after_s"):
        load_settings(heartbeat_interval_s=5, worker_lost_after_s=6)


def test_frozen() -> None:
    s = Settings()
    with pytest.raises(ValueError):
        s.local_workers = 9  # type: ignore[misc]
