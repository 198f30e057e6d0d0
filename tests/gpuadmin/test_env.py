import pytest
from django.core.exceptions import ImproperlyConfigured

from gpuadmin.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_rate,
    env_str,
    env_unix_user,
    node_environment,
    parse_database_url,
    parse_redis_url,
)


def test_env_bool_reads_words_and_refuses_anything_else(monkeypatch):
    monkeypatch.setenv("FLAG", "Yes")
    assert env_bool("FLAG", False) is True
    monkeypatch.setenv("FLAG", "0")
    assert env_bool("FLAG", True) is False
    monkeypatch.setenv("FLAG", "")
    assert env_bool("FLAG", True) is True
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG='maybe' is not a boolean"):
        env_bool("FLAG", False)


def test_env_int_checks_type_and_minimum(monkeypatch):
    monkeypatch.setenv("N", "12")
    assert env_int("N", 3) == 12
    monkeypatch.setenv("N", "twelve")
    with pytest.raises(ImproperlyConfigured, match="N='twelve' is not an integer"):
        env_int("N", 3)
    monkeypatch.setenv("N", "-1")
    with pytest.raises(ImproperlyConfigured, match="below the minimum of 0"):
        env_int("N", 3, minimum=0)


def test_env_float_checks_type_and_bounds(monkeypatch):
    monkeypatch.setenv("SHARE", "0.25")
    assert env_float("SHARE", 0.1) == 0.25
    monkeypatch.setenv("SHARE", "")
    assert env_float("SHARE", 0.1) == 0.1
    for raw, refusal in (
        ("a tenth", "is not a number"),
        ("nan", "is not a finite number"),
        ("-0.5", "below the minimum of 0"),
        ("1.5", "above the maximum of 1"),
    ):
        monkeypatch.setenv("SHARE", raw)
        with pytest.raises(ImproperlyConfigured, match=refusal):
            env_float("SHARE", 0.1, minimum=0, maximum=1)


def test_env_list_and_choice(monkeypatch):
    monkeypatch.setenv("HOSTS", "a.example, b.example,,")
    assert env_list("HOSTS", ["x"]) == ["a.example", "b.example"]
    monkeypatch.delenv("HOSTS")
    assert env_list("HOSTS", ["x"]) == ["x"]
    monkeypatch.setenv("MODE", "SIM")
    assert env_choice("MODE", ("real", "sim"), "real") == "sim"
    monkeypatch.setenv("MODE", "fake")
    with pytest.raises(ImproperlyConfigured, match="MODE='fake' must be one of: real, sim"):
        env_choice("MODE", ("real", "sim"), "real")


def test_env_str_prefers_the_secret_file(monkeypatch, tmp_path):
    secret = tmp_path / "key"
    secret.write_text("from-file\n")
    monkeypatch.setenv("TOKEN", "from-env")
    monkeypatch.setenv("TOKEN_FILE", str(secret))
    assert env_str("TOKEN") == "from-file"
    monkeypatch.setenv("TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="TOKEN_FILE=.* cannot be read"):
        env_str("TOKEN")


def test_parse_database_url_tcp_and_socket():
    tcp = parse_database_url("postgresql://gpu:s%40cret@db.internal:5433/fleet?sslmode=require")
    assert tcp == {
        "ENGINE": "gpuadmin.postgres",
        "NAME": "fleet",
        "USER": "gpu",
        "PASSWORD": "s@cret",
        "HOST": "db.internal",
        "PORT": "5433",
        "OPTIONS": {"sslmode": "require"},
    }
    socket_url = parse_database_url("postgresql://postgres:@/gpuadmin?host=/data/pgdata")
    assert socket_url["HOST"] == "/data/pgdata"
    assert socket_url["NAME"] == "gpuadmin"
    assert socket_url["PORT"] == ""


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///db.sqlite3", "scheme 'sqlite' is not supported"),
        ("mysql://root@localhost/x", "scheme 'mysql' is not supported"),
        ("postgresql://localhost:5432/", "has no database name"),
        ("postgresql://localhost/db?timeout=3", "unknown parameters: timeout"),
    ],
)
def test_parse_database_url_refuses_bad_urls(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url(url)


def test_parse_redis_url_one_server_is_taken_as_given():
    target = parse_redis_url("redis://:pw@redis.internal:6379/3")
    assert target.celery_url == "redis://:pw@redis.internal:6379/3"
    assert target.celery_transport_options == {}
    assert target.sentinels == ()


def test_parse_redis_url_sentinels_for_celery_and_the_client():
    target = parse_redis_url(
        "sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[fd00::3]:26381/2"
        "?master=gpuadmin&sentinel_password=spw"
    )
    assert target.sentinels == (("10.0.0.1", 26380), ("sentinel-b", 26379), ("fd00::3", 26381))
    assert (target.master, target.db, target.password) == ("gpuadmin", 2, "s@cret")
    # Celery's own form: one URL per Sentinel, the first carrying the database and password.
    assert target.celery_url == (
        "sentinel://:s%40cret@10.0.0.1:26380/2;sentinel://:s%40cret@sentinel-b:26379/2;"
        "sentinel://:s%40cret@[fd00::3]:26381/2"
    )
    options = target.celery_transport_options
    assert options["master_name"] == "gpuadmin"
    assert options["sentinel_kwargs"]["password"] == "spw"
    pool = target.client(socket_timeout=2).connection_pool
    assert pool.service_name == "gpuadmin"
    assert pool.connection_kwargs["db"] == 2 and pool.connection_kwargs["password"] == "s@cret"
    assert [
        s.connection_pool.connection_kwargs["password"] for s in pool.sentinel_manager.sentinels
    ] == ["spw"] * 3


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("memcached://h:11211", "scheme 'memcached' is not supported"),
        ("sentinel://h:26379/0", "names no primary: add \\?master=NAME"),
        ("sentinel://h:26379/x?master=m", "database 'x' is not a number"),
        ("sentinel://h:26379/0?master=m&ssl=1", "unknown parameters: ssl"),
        ("sentinel://h:port/0?master=m", "'h:port' is not a Sentinel's HOST:PORT"),
        ("sentinel://a,,b/0?master=m", "'' is not a Sentinel's HOST:PORT"),
    ],
)
def test_parse_redis_url_refuses_bad_urls(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_redis_url(url)


def test_env_rate_reads_n_per_period_or_off(monkeypatch):
    assert env_rate("RATE", "30/hour") == (30, 3600)
    monkeypatch.setenv("RATE", "600/min")
    assert env_rate("RATE", "30/hour") == (600, 60)
    monkeypatch.setenv("RATE", "OFF")
    assert env_rate("RATE", "30/hour") is None
    for bad in ("600", "0/min", "ten/min", "5/fortnight", "\u00b2/min"):
        monkeypatch.setenv("RATE", bad)
        with pytest.raises(ImproperlyConfigured, match=f"RATE={bad!r} is not a rate"):
            env_rate("RATE", "30/hour")


def test_a_node_is_given_its_settings_and_nothing_of_the_central_sides():
    central = {
        "DATABASE_URL": "postgresql://postgres@db/gpuadmin",
        "DATABASE_URL_FILE": "/run/secrets/db",
        "SECRET_KEY": "k" * 40,
        "SECRET_KEY_FILE": "/srv/gpuadmin/.gpuadmin/secret_key",
        "GPUADMIN_METRICS_TOKEN": "scrape",
        "GPUADMIN_TOKEN": "gpa_someone",
        "ALLOWED_HOSTS": "example.org",
        "AWS_SECRET_ACCESS_KEY": "whatever else the operator's shell holds",
    }
    node = {
        "REDIS_URL": "redis://central:6379/0",
        "GPUADMIN_NODE_TOKEN_FILE": "/etc/gpuadmin/node-token",
        "GPUADMIN_SAMPLE_INTERVAL_S": "1",
        "GPUADMIN_DATA_DIR": "/var/lib/gpuadmin",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": "/src",
        "LC_ALL": "C.UTF-8",
        "DJANGO_SETTINGS_MODULE": "gpuadmin.settings",
    }
    assert node_environment({**central, **node}) == node


def test_env_unix_user_takes_a_unix_user_name_or_nothing(monkeypatch):
    assert env_unix_user("ACCOUNT") == ""
    monkeypatch.setenv("ACCOUNT", "gpuadmin-job")
    assert env_unix_user("ACCOUNT") == "gpuadmin-job"
    monkeypatch.setenv("ACCOUNT", "../etc")
    with pytest.raises(ImproperlyConfigured, match="ACCOUNT='../etc' is not a Unix user name"):
        env_unix_user("ACCOUNT")
