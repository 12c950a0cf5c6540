"""The one line a user gets when a Ray cluster refuses this client, and which failures count as that."""

from __future__ import annotations

from qrag_ray.runtime.ray_start import auth_refused_message, client_auth_mode, refused_for_auth


def test_refused_message_names_what_to_set():
    msg = auth_refused_message("10.0.0.5:6379", "token")
    assert msg.startswith("the Ray cluster at 10.0.0.5:6379 requires its authentication token")
    assert "RAY_AUTH_TOKEN" in msg and "RAY_AUTH_TOKEN_PATH" in msg and "\n" not in msg
    assert "RAY_AUTH_MODE" not in msg
    off = auth_refused_message("10.0.0.5:6379", "disabled")
    assert "RAY_AUTH_MODE=disabled" in off and "RAY_AUTH_TOKEN_PATH" in off


def test_refused_for_auth_reads_the_cause_chain():
    from ray.exceptions import AuthenticationError

    try:
        try:
            raise RuntimeError("GCS: RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from inner
    except ConnectionError as error:
        assert refused_for_auth(error)
    assert refused_for_auth(AuthenticationError("no token"))
    try:
        try:
            raise TimeoutError("GCS did not answer")
        except TimeoutError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from inner
    except ConnectionError as error:
        assert not refused_for_auth(error)  # an unreachable cluster keeps Ray's own error


def test_client_auth_mode_defaults_to_token_and_keeps_an_explicit_choice(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert client_auth_mode() == "token"
    import os

    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert client_auth_mode() == "disabled"
