"""Lab 07's Triton code: config validation, repository writing, LLM-backend configs, measurement
helpers and the compose file (fast), and the real tritonserver from .venv-triton (slow).

Server tests need the Triton server environment. Under CI (env CI=true) a missing .venv-triton is
a failure — `make test` builds it first; elsewhere those tests skip and say how to build it.
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from lab_utils.servers.base import ServerStartError, port_in_use
from lab_utils.triton import (
    ConfigError,
    config_from_dict,
    config_problems,
    template_source,
    tree,
    validate_config,
    version_folders,
    write_model,
)
from lab_utils.triton.measure import (
    BatchCounts,
    batch_counts,
    metric_value,
    parse_metrics,
    run_load,
    run_open_loop,
)
from lab_utils.triton.recipes import (
    cost_stand_in_config,
    course_llm_config,
    ensemble_config,
    mlp_config,
    write_llm_models,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MLP = """
name: "mlp"
backend: "python"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 16 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 16 ] } ]
"""


# -- config validation -------------------------------------------------------------------------


def test_valid_config_parses_into_modelconfig():
    cfg = validate_config(MLP + "dynamic_batching { preferred_batch_size: [4, 8] }")
    assert type(cfg).__name__ == "ModelConfig"
    assert (cfg.name, cfg.backend, cfg.max_batch_size) == ("mlp", "python", 8)
    assert [t.name for t in cfg.input] == ["x"] and list(cfg.input[0].dims) == [16]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config_problems(cfg, "mlp") == []


@pytest.mark.parametrize(
    "text, field, hint",
    [
        ('name: "m"\nmax_batch_sise: 8', "max_batch_sise", "did you mean 'max_batch_size'"),
        ("dynamic_batching { prefered_batch_size: [4] }", "prefered_batch_size", "'preferred_batch_size'"),
        ('input [ { name: "x" datatype: TYPE_FP32 dims: [1] } ]', "datatype", "'data_type'"),
        ("instance_group [ { kind: KIND_CPU cnt: 2 } ]", "cnt", "'count'"),
    ],
)
def test_misspelt_fields_are_named(text, field, hint):
    with pytest.raises(ConfigError) as err:
        validate_config(text)
    assert err.value.field == field
    assert f"unknown field '{field}'" in str(err.value) and hint in str(err.value)


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ('max_batch_size: "eight"', "max_batch_size", "expects int32"),
        ("max_batch_size: 2.5", "max_batch_size", "expects int32"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [1.5] } ]', "dims", "expects int64"),
        ("backend: python", "backend", "expects string"),
        ("dynamic_batching { max_queue_delay_microseconds: -1 }", "max_queue_delay_microseconds", "uint64"),
        ("model_transaction_policy { decoupled: maybe }", "decoupled", "bool"),
    ],
)
def test_wrong_types_name_the_field_and_its_type(text, field, fragment):
    with pytest.raises(ConfigError) as err:
        validate_config(text)
    assert err.value.field == field
    assert f"field '{field}'" in str(err.value) and fragment in str(err.value)
    assert err.value.line == 1


def test_wrong_enum_value_suggests_the_triton_spelling():
    with pytest.raises(ConfigError) as err:
        validate_config('input [ { name: "x"\n data_type: TYPE_FLOAT dims: [1] } ]')
    assert err.value.field == "data_type" and err.value.line == 2
    assert "did you mean TYPE_FP32?" in str(err.value)


def test_config_problems_catch_what_parses_but_would_not_load():
    assert config_problems(
        MLP.replace("max_batch_size: 8", "max_batch_size: 0") + "dynamic_batching { }"
    ) == ["dynamic_batching needs max_batch_size > 0 (0 means the model cannot batch)"]
    assert config_problems(MLP + "dynamic_batching { preferred_batch_size: [4, 16] }") == [
        "preferred_batch_size 16 exceeds max_batch_size 8"
    ]
    assert config_problems(MLP, folder_name="other") == ["name 'mlp' differs from its folder 'other'"]
    assert config_problems('name: "x"') == ['set backend (e.g. "python") or platform (e.g. "ensemble")']
    seed = (
        'name: "l" platform: "tensorrt_llm" '
        'parameters { key: "gpt_model_type" value: { string_value: "llama" } }'
    )
    problems = config_problems(seed)
    assert len(problems) == 2 and "not a Triton platform" in problems[0] and "batching mode" in problems[1]


def test_ensemble_problems_follow_the_tensors():
    cfg = ensemble_config()
    assert config_problems(config_from_dict(cfg), "pipeline") == []
    cfg["ensemble_scheduling"]["step"][1]["input_map"]["input_ids"] = "prompt_idz"
    cfg["ensemble_scheduling"]["step"][2]["output_map"] = {"text_output": "txt"}
    assert config_problems(config_from_dict(cfg), "pipeline") == [
        "step 1 (generator) reads 'prompt_idz' for its input 'input_ids', but no ensemble input or "
        "earlier step produces it",
        "ensemble output 'text_output' is not written by any step's output_map",
    ]


def test_config_from_dict_renders_text_and_rejects_unknown_keys():
    text = config_from_dict({"name": "m", "backend": "python", "max_batch_size": 4})
    assert text == 'name: "m"\nmax_batch_size: 4\nbackend: "python"\n'  # protobuf field order
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "m", "max_batch": 4})
    assert err.value.field == "max_batch"


# -- repository writing ------------------------------------------------------------------------


def test_write_model_layout(tmp_path):
    folder = write_model(
        tmp_path, "mlp", MLP, {1: {"model.py": "# v1"}, 3: {"model.py": "# v3", "w.bin": b"\0\1"}}
    )
    assert folder == tmp_path / "mlp"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "mlp",
        "mlp/1",
        "mlp/1/model.py",
        "mlp/3",
        "mlp/3/model.py",
        "mlp/3/w.bin",
        "mlp/config.pbtxt",
    ]
    assert (folder / "3" / "w.bin").read_bytes() == b"\0\1"
    assert validate_config((folder / "config.pbtxt").read_text()).name == "mlp"
    assert version_folders(folder) == [1, 3]
    write_model(tmp_path, "noconf", None, {2: {"model.py": ""}})
    write_model(tmp_path, "ens", ensemble_config("ens"), {1: {}})
    assert not (tmp_path / "noconf" / "config.pbtxt").exists()
    assert tree(tmp_path) == "\n".join(
        [
            f"{tmp_path.name}/",
            "├── ens/",
            "│   ├── 1/",
            "│   └── config.pbtxt",
            "├── mlp/",
            "│   ├── 1/",
            "│   │   └── model.py",
            "│   ├── 3/",
            "│   │   ├── model.py",
            "│   │   └── w.bin",
            "│   └── config.pbtxt",
            "└── noconf/",
            "    └── 2/",
            "        └── model.py",
        ]
    )


def test_write_model_refuses_bad_input_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="positive integers"):
        write_model(tmp_path, "m", None, {0: {}})
    with pytest.raises(ConfigError, match="max_batch_sise"):
        write_model(tmp_path, "m", "max_batch_sise: 1")
    with pytest.raises(ConfigError, match="differs from its folder"):
        write_model(tmp_path, "other", MLP)
    with pytest.raises(ValueError, match="letters, digits"):
        write_model(tmp_path, "a/b", None)
    assert list(tmp_path.iterdir()) == []
    write_model(tmp_path, "mlp", MLP)
    with pytest.raises(FileExistsError):
        write_model(tmp_path, "mlp", MLP)
    write_model(tmp_path, "mlp", MLP, {2: {}}, replace=True)
    assert version_folders(tmp_path / "mlp") == [2]


def test_templates_and_recipes(tmp_path):
    assert "class TritonPythonModel" in template_source("mlp")
    with pytest.raises(FileNotFoundError, match="shipped templates"):
        template_source("nope")
    names = write_llm_models(tmp_path, tmp_path / "model", max_tokens=8)
    assert names == ["llm", "llm_stream", "tokenizer", "generator", "detokenizer", "pipeline"]
    for name in names:
        cfg = validate_config((tmp_path / name / "config.pbtxt").read_text())
        assert config_problems(cfg, name) == [], name
    assert validate_config(
        (tmp_path / "llm_stream" / "config.pbtxt").read_text()
    ).model_transaction_policy.decoupled
    with pytest.raises(ValueError, match="only MODE 'text' streams"):
        course_llm_config("g", "generate", tmp_path, decoupled=True)
    assert (
        "dynamic_batching" not in mlp_config() and mlp_config(dynamic_batching={})["dynamic_batching"] == {}
    )
    assert "class TritonPythonModel" in template_source("cost_stand_in")
    stand_in = validate_config(
        config_from_dict(
            cost_stand_in_config(
                fixed_s=0.004,
                per_item_s=0.001,
                dynamic_batching={"preferred_batch_size": [8], "max_queue_delay_microseconds": 20000},
            )
        )
    )
    assert {k: v.string_value for k, v in stand_in.parameters.items()} == {
        "FIXED_S": "0.004",
        "PER_ITEM_S": "0.001",
    }
    assert (
        list(stand_in.dynamic_batching.preferred_batch_size) == [8]
        and config_problems(stand_in, "stand_in") == []
    )
    with pytest.raises(ValueError, match="not both 0"):
        cost_stand_in_config(fixed_s=0, per_item_s=0)


# -- LLM backend configs -----------------------------------------------------------------------


def test_trtllm_config_fields():
    from lab_utils.triton.llm_backends import trtllm_config

    cfg = validate_config(
        trtllm_config(
            engine_dir="/e",
            max_tokens_in_paged_kv_cache=4096,
            kv_cache_free_gpu_mem_fraction=0.8,
            batch_scheduler_policy="guaranteed_no_evict",
        )
    )
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["max_tokens_in_paged_kv_cache"] == "4096"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.8"
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert params["gpt_model_path"] == "/e"
    assert cfg.backend == "tensorrtllm" and cfg.model_transaction_policy.decoupled
    assert "max_tokens_in_paged_kv_cache" not in {
        k for k in validate_config(trtllm_config(engine_dir="/e")).parameters
    }
    for bad in (
        {"kv_cache_free_gpu_mem_fraction": 1.5},
        {"batch_scheduler_policy": "fifo"},
        {"gpt_model_type": "llama"},
        {"max_tokens_in_paged_kv_cache": 0},
    ):
        with pytest.raises(ValueError):
            trtllm_config(engine_dir="/e", **bad)


def test_llmapi_model_yaml_is_validated_llm_api_arguments():
    import yaml

    from lab_utils.triton.llm_backends import llmapi_model_yaml
    from lab_utils.trtllm.options import OptionsError

    text = llmapi_model_yaml(
        "meta-llama/Llama-3.1-8B-Instruct",
        {"max_batch_size": 64, "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "max_tokens": 200_000}},
        decoupled=True,
    )
    body = yaml.safe_load(text)
    assert body["model"] == "meta-llama/Llama-3.1-8B-Instruct" and body["backend"] == "pytorch"
    assert body["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "max_tokens": 200_000}
    assert body["triton_config"] == {"max_batch_size": 0, "decoupled": True}  # batching is the executor's
    with pytest.raises(OptionsError, match="free_gpu_memory_fraction"):
        llmapi_model_yaml("m", {"kv_cache_config": {"free_gpu_mem_fraction": 0.9}})
    with pytest.raises(ValueError):
        llmapi_model_yaml("m", {"triton_config": {}})


def test_llmapi_model_folder_is_written_and_read_back(tmp_path):
    from lab_utils.triton.llm_backends import llmapi_model_yaml, read_llmapi_model, write_llmapi_model

    text = llmapi_model_yaml("m", {"tensor_parallel_size": 2, "kv_cache_config": {"max_tokens": 1000}})
    folder = write_llmapi_model(tmp_path, text)
    assert folder == tmp_path / "tensorrt_llm" and (folder / "1" / "model.yaml").read_text() == text
    assert read_llmapi_model(text)["kv_cache_config"] == {"max_tokens": 1000}
    for bad, why in [
        ("backend: pytorch\n", "needs a `model`"),
        ("model: m\ngpt_model_path: /engines/x\n", "removed C\\+\\+ engine backend"),
        (
            "model: m\nkv_cache_config:\n  kv_cache_free_gpu_mem_fraction: 0.9\n",
            "kv_cache_free_gpu_mem_fraction",
        ),
        ("model: m\ntriton_config: 0\n", "triton_config"),
    ]:
        with pytest.raises(ValueError, match=why):
            read_llmapi_model(bad)
        with pytest.raises(ValueError):
            write_llmapi_model(tmp_path / "other", bad)
    assert not (tmp_path / "other").exists()


def test_vllm_backend_folder(tmp_path):
    import json

    from lab_utils.triton.llm_backends import vllm_engine_arg_names, vllm_model_json, write_vllm_model

    folder = write_vllm_model(tmp_path, "smol", vllm_model_json("m", max_model_len=1024))
    assert json.loads((folder / "1" / "model.json").read_text())["max_model_len"] == 1024
    cfg = validate_config((folder / "config.pbtxt").read_text())
    from tritonclient.grpc import model_config_pb2

    kind = model_config_pb2.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind)
    assert cfg.backend == "vllm" and kind == "KIND_MODEL"
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        vllm_model_json("m", gpu_memory_utilization=0)
    if vllm_engine_arg_names() is None:
        pytest.skip("vLLM is not installed here: engine-argument names cannot be checked")
    with pytest.raises(ValueError, match=r"gpu_mem_util \(did you mean gpu_memory_utilization\?\)"):
        vllm_model_json("m", gpu_mem_util=0.5)


# -- measurement helpers -----------------------------------------------------------------------


def test_batch_counts_and_difference():
    def stats(inf, ex, sizes):
        return {
            "model_stats": [
                {
                    "name": "m",
                    "version": "1",
                    "inference_count": inf,
                    "execution_count": ex,
                    "batch_stats": [
                        {"batch_size": b, "compute_infer": {"count": n, "ns": 1}} for b, n in sizes.items()
                    ],
                }
            ]
        }

    before = batch_counts(stats(3, 3, {1: 3}), "m")
    after = batch_counts(stats(15, 6, {1: 4, 2: 1, 8: 1, 3: 0}), "m")
    delta = after - before
    assert delta == BatchCounts(12, 3, {1: 1, 2: 1, 8: 1})
    assert delta.average_batch == 4.0 and BatchCounts(0, 0, {}).average_batch == 0.0
    assert delta.compute_s == {1: 0.0, 2: 1e-9, 8: 1e-9} and delta.mean_compute_s(2) == 1e-9
    assert math.isnan(delta.mean_compute_s(4))
    with pytest.raises(KeyError, match="is it loaded"):
        batch_counts(stats(1, 1, {}), "other")


def test_metrics_parsing():
    text = (
        '# HELP x\nnv_inference_count{model="a",version="1"} 3\nnv_inference_count{model="a",version="2"} 4\n'
        'nv_inference_count{model="ab",version="1"} 100\nnv_gpu_utilization 0.5\n'
    )
    assert parse_metrics(text)[0] == ("nv_inference_count", {"model": "a", "version": "1"}, 3.0)
    assert metric_value(text, "nv_inference_count", model="a") == 7.0
    assert metric_value(text, "nv_inference_count", model="a", version="2") == 4.0
    assert metric_value(text, "nv_gpu_utilization") == 0.5 and metric_value(text, "missing") == 0.0


def test_run_load_counts_every_request_and_error():
    seen, lock = [], threading.Lock()

    def send(i):
        with lock:
            seen.append(i)
        if i % 5 == 0:
            raise RuntimeError("boom")

    result = run_load(send, 20, 4)
    assert sorted(seen) == list(range(20))
    assert len(result.latencies_s) == 16 and len(result.errors) == 4 and result.summary()["errors"] == 4
    with pytest.raises(ValueError):
        run_load(send, 0, 1)


def test_run_open_loop_bookkeeping_on_a_fake_clock():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(round(s, 9))
        now[0] += s

    def send(i, done):
        now[0] += 0.002  # every send costs the client 2 ms
        if i == 1:
            raise ConnectionError("refused")
        if i == 2:
            done("server error")
        elif i in (0, 3):
            now[0] += 0.003  # answered 3 ms after the send returned
            done(None)
            done("late duplicate")  # counted once
        # request 4 is never answered

    result = run_open_loop(
        send, [0.0, 0.001, 0.010, 0.011, 0.050], timeout_s=0.01, clock=lambda: now[0], sleep=sleep
    )
    assert slept == [0.003, 0.033]  # waits only when ahead of the schedule
    assert result.sent_s == pytest.approx([0.0, 0.005, 0.010, 0.012, 0.050])
    assert result.lag_s == pytest.approx([0.0, 0.004, 0.0, 0.001, 0.0])
    assert result.done_s[:4] == pytest.approx([0.005, 0.007, 0.012, 0.017]) and math.isnan(result.done_s[4])
    assert sorted(result.errors) == [1, 2, 4]
    assert result.errors[1] == "ConnectionError: refused" and result.errors[2] == "server error"
    assert "no answer within 0.01 s" in result.errors[4]
    assert result.latencies_s == pytest.approx([0.005, 0.006])  # from the due time, answered requests only
    assert result.latencies_from_send_s == pytest.approx([0.005, 0.005])
    summary = result.summary()
    assert summary["errors"] == 3 and summary["send_lag_max_ms"] == 4.0
    with pytest.raises(ValueError, match="ascending"):
        run_open_loop(send, [0.2, 0.1])
    assert run_open_loop(send, []).summary()["errors"] == 0


# -- launcher without a server -----------------------------------------------------------------


def test_three_ports_are_distinct():
    from lab_utils.servers.triton import _three_ports

    for _ in range(20):
        ports = _three_ports(None, None, None)
        assert len(set(ports)) == 3
    assert _three_ports(9000, None, 9002)[0::2] == (9000, 9002)
    with pytest.raises(ValueError, match="must differ"):
        _three_ports(9000, 9000, None)


def test_missing_environment_says_how_to_build_it(monkeypatch, tmp_path):
    import lab_utils.servers.triton as triton

    monkeypatch.setenv("TRITON_VENV", str(tmp_path / "absent"))
    monkeypatch.setattr(triton, "NGC_ROOT", tmp_path / "no-ngc")
    with pytest.raises(FileNotFoundError, match="make triton-env"):
        triton.prepare_install()


# -- docker compose ----------------------------------------------------------------------------


def test_compose_file():
    import yaml

    path = REPO_ROOT / "docker" / "triton-compose.yml"
    svc = yaml.safe_load(path.read_text())["services"]["triton"]
    image = svc["image"]
    assert image.startswith("nvcr.io/nvidia/tritonserver:") and "latest" not in image
    assert ":-24.10-" in image, "pin the NGC tag (24.10 = Triton 2.51, the CPU-mode binary's version)"
    assert svc["shm_size"] == "2gb"
    assert sorted(p.split(":", 1)[1] for p in svc["ports"]) == ["8000:8000", "8001:8001", "8002:8002"]
    assert all(p.startswith("127.0.0.1:") for p in svc["ports"])
    assert any(v.endswith(":/models:ro") for v in svc["volumes"])
    assert "--model-repository=/models" in svc["command"]
    device = svc["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    compose = shutil.which("docker-compose")
    if compose:  # Debian's docker-compose validates keys without an engine
        out = subprocess.run([compose, "-f", str(path), "config", "-q"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


# -- the real server (slow) --------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_python() -> Path:
    from lab_utils.runtime import triton_env_python

    python = triton_env_python()
    if python is None:
        reason = ".venv-triton is missing: build it with `make triton-env` (bash scripts/triton_env.sh)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.slow
def test_lifecycle(triton_python, tmp_path):
    from lab_utils.servers.triton import TritonServer

    write_model(tmp_path, "mlp", mlp_config(dynamic_batching={}), {1: {"model.py": template_source("mlp")}})
    srv = TritonServer(tmp_path, python=triton_python)
    assert srv.argv[srv.argv.index("--http-address") + 1] == "127.0.0.1"
    assert srv.argv[srv.argv.index("--grpc-address") + 1] == "127.0.0.1"
    assert srv.argv[srv.argv.index("--metrics-address") + 1] == "127.0.0.1"
    with srv:
        assert srv.model_ready("mlp")
        assert all(port_in_use(p) for p in (srv.port, srv.grpc_port, srv.metrics_port))
        assert "nv_inference_count" in srv.metrics_text()
        pgid = srv.pid
        regions = srv._shm_regions()
        assert regions, "the python backend maps its shared memory region into the server"
    assert not srv.is_running and not _group_alive(pgid), "server or a backend stub survived stop()"
    assert not any(port_in_use(p) for p in (srv.port, srv.grpc_port, srv.metrics_port))
    assert not any(r.exists() for r in regions)
    assert srv.stop() is not None  # stopping twice is harmless
    assert "Started HTTPService at 127.0.0.1" in srv.log_text()


@pytest.mark.slow
def test_startup_failure_raises_with_log_tail(triton_python, tmp_path):
    from lab_utils.servers.triton import TritonServer

    broken = "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('weights missing XYZ')\n"
    write_model(tmp_path, "broken", MLP.replace('"mlp"', '"broken"'), {1: {"model.py": broken}})
    srv = TritonServer(tmp_path, python=triton_python, startup_timeout=120)
    with pytest.raises(ServerStartError) as err:
        srv.start()
    assert "weights missing XYZ" in err.value.log_tail
    assert not srv.is_running and not _group_alive(srv.pid)


@pytest.fixture(scope="module")
def llm_server(triton_python, tmp_path_factory, course_model):
    from lab_utils.servers.triton import TritonServer

    repo = tmp_path_factory.mktemp("triton-repo")
    write_model(repo, "mlp", mlp_config(), {1: {"model.py": template_source("mlp")}})
    write_llm_models(repo, course_model, max_tokens=8)
    with TritonServer(repo, model_control="explicit", python=triton_python) as srv:
        yield srv


@pytest.mark.slow
def test_server_batches_under_concurrency(llm_server):
    import httpx

    llm_server.load_model("mlp", mlp_config(dynamic_batching={"max_queue_delay_microseconds": 20000}))
    body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    with httpx.Client(timeout=60) as client:

        def send(i):
            client.post(f"{llm_server.url}/v2/models/mlp/infer", json=body).raise_for_status()

        before = batch_counts(llm_server.statistics("mlp"), "mlp")
        result = run_load(send, 32, 8)
        counts = batch_counts(llm_server.statistics("mlp"), "mlp") - before
    assert result.errors == []
    assert counts.inference_count == 32
    assert counts.execution_count < counts.inference_count, counts
    assert sum(b * n for b, n in counts.batch_sizes.items()) == 32 and max(counts.batch_sizes) > 1


@pytest.mark.slow
def test_dynamic_batching_config_reaches_the_server(triton_python, tmp_path):
    """The batcher does what its config block says, seen in Triton's own batch-size histogram.

    Requests go out about a millisecond apart, so while a formed batch waits for the model
    instance, Triton may still add later arrivals to it (up to max_batch_size). Each case below
    is built so that race cannot change the histogram.
    """
    import numpy as np
    import tritonclient.grpc as grpcclient

    from lab_utils.servers.triton import TritonServer
    from lab_utils.triton.measure import grpc_async_sender, measure_batcher

    cost = {"fixed_s": 0.002, "per_item_s": 0.0005, "max_batch_size": 8}
    long_delay = 10_000_000  # 10 s: no request here may wait for it
    write_model(
        tmp_path,
        "stand_in",
        cost_stand_in_config(**cost),
        {1: {"model.py": template_source("cost_stand_in")}},
    )
    with TritonServer(tmp_path, model_control="explicit", python=triton_python) as srv:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            x = grpcclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
            send = grpc_async_sender(client, "stand_in", [x])

            def run(batching, arrivals, warmup):
                return measure_batcher(
                    srv,
                    "stand_in",
                    cost_stand_in_config(**cost, dynamic_batching=batching),
                    arrivals,
                    send,
                    warmup=warmup,
                    timeout_s=3.0,
                )

            # preferred size 4: a batch leaves as soon as 4 are queued, long before the delay;
            # two waves of 4, the second after the first is answered
            preferred = {"preferred_batch_size": [4], "max_queue_delay_microseconds": long_delay}
            pref, pref_counts = run(preferred, [0.0] * 4 + [0.5] * 4, 4)
            served = srv.model_config("stand_in")["dynamic_batching"]
            # no preferred size: the batcher holds requests until max_batch_size are queued
            full, full_counts = run({"max_queue_delay_microseconds": long_delay}, [0.0] * 8, 8)
            off, off_counts = run(None, [0.0] * 8, 4)  # no dynamic_batching block: every request alone
            assert client.infer("stand_in", [x]).as_numpy("y").tolist() == [[1.0]]  # y = x
        finally:
            client.close()
    assert served["preferred_batch_size"] == [4] and int(served["max_queue_delay_microseconds"]) == long_delay
    assert pref.errors == {} and full.errors == {} and off.errors == {}, (
        "answered within 3 s, before the delay"
    )
    assert (pref_counts.inference_count, pref_counts.execution_count, pref_counts.batch_sizes) == (
        8,
        2,
        {4: 2},
    )
    assert (full_counts.inference_count, full_counts.execution_count, full_counts.batch_sizes) == (
        8,
        1,
        {8: 1},
    )
    assert (off_counts.inference_count, off_counts.execution_count, off_counts.batch_sizes) == (8, 8, {1: 8})
    # Triton's own timing of an execution includes the stand-in's sleep (2 ms + 0.5 ms per row)
    assert pref_counts.mean_compute_s(4) >= 0.004 and off_counts.mean_compute_s(1) >= 0.0025


def _infer(url: str, model: str, inputs: list[dict]) -> dict:
    import httpx

    r = httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": inputs}, timeout=300)
    r.raise_for_status()
    return {o["name"]: o["data"] for o in r.json()["outputs"]}


@pytest.mark.slow
def test_ensemble_matches_three_calls_and_stream(llm_server):
    import httpx

    url, prompt = llm_server.url, "What is the capital of France?"
    llm_server.load_model("pipeline")
    text = [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]}]
    limit = [{"name": "max_tokens", "shape": [1], "datatype": "INT32", "data": [8]}]
    ids = _infer(url, "tokenizer", text)["input_ids"]
    new = _infer(
        url,
        "generator",
        [{"name": "input_ids", "shape": [len(ids)], "datatype": "INT64", "data": ids}] + limit,
    )["output_ids"]
    assert 0 < len(new) <= 8
    separate = _infer(
        url, "detokenizer", [{"name": "output_ids", "shape": [len(new)], "datatype": "INT64", "data": new}]
    )["text_output"][0]
    ensemble = _infer(url, "pipeline", text + limit)["text_output"][0]
    assert ensemble == separate and "Paris" in ensemble
    # the decoupled all-in-one model streams the same greedy text, one piece per event
    llm_server.load_model("llm_stream")
    pieces = []
    with httpx.stream(
        "POST",
        f"{url}/v2/models/llm_stream/generate_stream",
        json={"text_input": prompt, "max_tokens": 8},
        timeout=300,
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                import json

                pieces.append(json.loads(line[6:])["text_output"])
    assert len(pieces) > 1 and "".join(pieces) == ensemble


@pytest.mark.slow
def test_grpc_stream_from_decoupled_model(llm_server):
    import numpy as np
    import tritonclient.grpc as grpcclient

    llm_server.load_model("llm_stream")
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(llm_server.grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"What is the capital of France?"], dtype=object))
    client.async_stream_infer("llm_stream", [text], enable_empty_final_response=True)
    pieces = []
    while True:
        result, error = q.get(timeout=300)
        assert error is None, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        pieces.append(result.as_numpy("text_output")[0].decode())
    client.stop_stream()
    client.close()
    assert len(pieces) > 1 and "Paris" in "".join(pieces)


# -- lab 07 questions: right answers pass, typical wrong ones get a hint -------------------------


def _score(qid: str, **answers):
    from lab_utils.grading import get, score

    return score(get(qid), answers)
