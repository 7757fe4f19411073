"""Upstreams: where the chat proxy forwards each model's requests, and with what key."""

import urllib.parse

import pytest

from sklocus.serve import Upstreams


def test_upstreams_are_read_from_toml_with_keys_from_the_environment(tmp_path):
    path = tmp_path / "upstreams.toml"
    path.write_text(
        '[models."small-one"]\n'
        'base_url = "http://gpu-1:8000/v1"\n'
        'api_key_env = "SMALL_KEY"\n'
        "[models.large]\n"
        'base_url = "https://api.example.com/v1/"\n'
        'model = "large-2"\n'
    )
    upstreams = Upstreams.read(
        path, fallbacks=2, timeout=5, environ={"SMALL_KEY": " sk-1 "}
    )
    assert list(upstreams) == ["small-one", "large"]
    assert (upstreams.fallbacks, upstreams.timeout) == (2, 5.0)
    small, large = upstreams["small-one"], upstreams["large"]
    assert small.model == "small-one"
    assert small.headers()["authorization"] == "Bearer sk-1"
    assert large.model == "large-2"
    assert "authorization" not in large.headers()
    assert large.completions_url == "https://api.example.com/v1/chat/completions"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({}, "model 'm': no base_url"),
        ({"base_url": "ftp://host/v1"}, "not an http:// or https:// URL"),
        ({"base_url": "http://user:sk-abc@host/v1"}, "base_url holds credentials"),
        ({"base_url": "http://host/v1?key=sk-abc"}, "holds a query or fragment"),
        ({"base_url": "http://host/v1", "api_key": "sk-abc"}, "give api_key_env"),
        ({"base_url": "http://host/v1", "api_key_env": "UNSET"}, "UNSET (api_key_env)"),
        ({"base_url": "http://host/v1", "model": ""}, "model must be non-empty"),
        ({"base_url": 7}, "base_url must be non-empty text"),
        ({"base_url": "http://host:99999/v1"}, "port that is not a number"),
        ({"base_url": "http://host:0/v1"}, "port that is not a number"),
        ({"base_url": "http://host:8x/v1"}, "port that is not a number"),
        ({"base_url": "http://ho st/v1"}, "holds a space or a control character"),
        ({"base_url": "http://host/v 1"}, "holds a space or a control character"),
    ],
)
def test_bad_upstreams_are_refused_by_model_and_field(fields, message):
    with pytest.raises(ValueError, match="upstreams: model 'm'") as raised:
        Upstreams({"m": fields}, environ={})
    assert message in str(raised.value)
    assert "sk-abc" not in str(raised.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[models.m\n", "not valid TOML"),
        ("[proxy]\nfallbacks = 2\n", "unknown table 'proxy'"),
        ("", "no models"),
    ],
)
def test_bad_upstream_files_are_refused_by_name(tmp_path, text, message):
    path = tmp_path / "upstreams.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as raised:
        Upstreams.read(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"fallbacks": -1}, "fallbacks=-1; expected at least 0"),
        ({"fallbacks": True}, "expected an integer"),
        ({"timeout": 0}, "timeout=0; expected a number of seconds above 0"),
        ({"timeout": float("inf")}, "timeout=inf"),
    ],
)
def test_fallbacks_and_timeout_are_checked(settings, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Upstreams({"m": {"base_url": "http://host/v1"}}, **settings)


def test_keys_that_cannot_go_in_a_header_are_refused_without_repeating_them():
    with pytest.raises(ValueError, match="KEY_VAR") as raised:
        Upstreams(
            {"m": {"base_url": "http://h/v1", "api_key_env": "KEY_VAR"}},
            environ={"KEY_VAR": "sk-\u00e9t\u00e9"},
        )
    assert "sk-" not in str(raised.value)


def test_an_upstream_shows_and_compares_without_its_key():
    upstreams = Upstreams(
        {"m": {"base_url": "http://h/v1", "api_key_env": "K"}}, environ={"K": "sk-1"}
    )
    upstream = upstreams["m"]
    assert "sk-1" not in repr(upstream) + repr(upstreams)
    assert not hasattr(upstream, "__dict__")  # vars() and asdict() cannot reach it
    assert upstream.scrubbed("bad key sk-1!") == "bad key [key]!"


@pytest.mark.parametrize(
    "name, shown",
    [
        ("model-0001", "model-0001"),
        ("org/model 7b", "org/model%207b"),
        ("modèle", "mod%C3%A8le"),
        ("100%", "100%25"),
    ],
)
def test_model_names_are_carried_by_headers_as_percent_encoded_utf8(name, shown):
    pytest.importorskip("httpx")
    from sklocus.serve._proxy import _header_text

    assert _header_text(name) == shown
    assert urllib.parse.unquote(_header_text(name)) == name


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"deadline": 0}, "deadline=0; expected a number of seconds above 0"),
        ({"deadline": float("inf")}, "deadline=inf"),
        ({"timeout": 30, "deadline": 10}, "deadline=10 is below timeout=30"),
        ({"max_answer_bytes": 0}, "max_answer_bytes=0; expected an integer above 0"),
        ({"max_answer_bytes": 1.5}, "max_answer_bytes=1.5"),
        ({"max_answer_bytes": True}, "max_answer_bytes=True"),
    ],
)
def test_bad_deadlines_and_caps_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        Upstreams({"m": {"base_url": "http://host/v1"}}, **settings)


def test_a_whole_call_has_a_deadline_and_an_answer_a_cap_by_default():
    upstreams = Upstreams({"m": {"base_url": "http://host/v1"}})
    assert (upstreams.timeout, upstreams.deadline) == (60.0, 600.0)
    assert upstreams.max_answer_bytes == 16 * 2**20
    assert "deadline=600" in repr(upstreams)
