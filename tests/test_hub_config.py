"""A hub id outside the catalog and the local cache: its config.json (and a vision-language model's processor config) is
fetched from the Hub with huggingface_hub, kept in the HF cache, and answered; offline, the error says how to give a
local folder. A local HTTP server stands in for the Hub ($HF_ENDPOINT): nothing leaves the machine."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from advisor.core.catalog import resolve_model
from advisor.core.errors import AdvisorInputError
from cli_run import advisor_json

COMMIT = "a" * 40
REPO = "someone/tiny-llama-like"
CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
          "tie_word_embeddings": False}
FILES = {(REPO, "config.json"): json.dumps(CONFIG).encode()}


class Hub(BaseHTTPRequestHandler):
    """``/{repo}/resolve/{revision}/{file}`` as the Hub answers it: the file, its commit and its ETag."""

    requests: list[str] = []

    def _file(self):
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        return FILES.get(("/".join(parts[:2]), "/".join(parts[4:])))

    def _head(self, body):
        type(self).requests.append(f"{self.command} {self.path}")
        if body is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound" if self.path.startswith(f"/{REPO}/") else
                             "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        return True

    def do_HEAD(self):  # noqa: N802 - http.server's name
        self._head(self._file())

    def do_GET(self):  # noqa: N802
        body = self._file()
        if self._head(body):
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hub.requests = []
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    yield Hub
    server.shutdown()


def test_a_hub_id_outside_the_catalog_is_fetched_cached_and_answered(hub, tmp_path):
    spec = resolve_model(REPO)
    assert spec.source == "hub" and spec.num_layers == 4 and spec.hidden_size == 256
    assert any("config.json" in r for r in hub.requests)
    code, d, _ = advisor_json("estimate", "--model", REPO, "--gpu-budget", "8GB", "--json")
    assert code == 0 and d["model"]["hf_id"] == REPO
    hub.requests.clear()
    assert resolve_model(REPO).source == "hf-cache" and not hub.requests  # kept: asked once


def test_a_repository_the_hub_does_not_have_is_one_line(hub):
    with pytest.raises(AdvisorInputError, match="the Hub has no such repository"):
        resolve_model("nobody/no-such-model")


def test_offline_says_how_to_give_a_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AdvisorInputError, match="offline.*local folder holding its config.json"):
        resolve_model("someone/not-cached")


def test_no_network_is_said_at_once_without_huggingface_hubs_retries(monkeypatch):
    """A Hub that cannot be reached (a name that does not resolve: RFC 2606's .invalid) is the clear error at once;
    huggingface_hub would retry the connection five times (about 23 s) first."""
    import huggingface_hub

    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("asked the Hub"))
    with pytest.raises(AdvisorInputError, match=r"could not be reached \(http://hub.invalid: no connection\)"):
        resolve_model("someone/not-cached")


def test_a_vision_language_snapshot_brings_its_processor_settings(tmp_path):
    """The image and video processors' configs of a snapshot, as models.yaml's ``processor`` holds them (what the
    token counts read: advisor.core.vision_tokens)."""
    from advisor.core.catalog import model_catalog, processor_in

    catalogued = model_catalog()["qwen2.5-vl-7b-instruct"]["processor"]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessor", "image_mean": [0.5], **catalogued["image"]}))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "Qwen2VLVideoProcessor", **catalogued["video"]}))
    got = processor_in(tmp_path)
    assert got == {"image": {**catalogued["image"]}, "video": {**catalogued["video"]}}
    assert processor_in(tmp_path / "nothing-here") is None
