"""vLLM on Modal, written against Modal 1.6's API and constructed offline (nothing is deployed).

    app, serve, settings = build_app()        # modal.App with one web-server function
    function_report(serve)                    # what Modal would run: GPU, volumes, secrets, port

`modal deploy lab_utils/deploy/modal_app.py` (with Modal credentials) would deploy the module-level
`app`; the course never does. The names below are today's (checked with modal 1.6.4 installed,
2026-12-01); the older spellings fail at definition time with a DeprecationError or an
AttributeError:

    old (the seeds)                          today
    gpu=modal.gpu.A100(count=2, size="80GB") gpu="A100-80GB:2"        (modal.gpu was removed)
    container_idle_timeout=300               scaledown_window=300
    allow_concurrent_inputs=64               @modal.concurrent(max_inputs=64)
    keep_warm=1                              min_containers=1
    concurrency_limit=4                      max_containers=4
    @modal.web_endpoint()                    @modal.fastapi_endpoint()  (a FastAPI function)
    a FastAPI wrapper around vLLM            @modal.web_server(port=8000): Modal proxies the
                                             port of the server the function starts
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..facts import fact

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
CACHE = "/root/.cache/huggingface"


@dataclass(frozen=True)
class ModalSettings:
    """The deployment's knobs, in today's Modal names."""

    app_name: str = "llm-serving-lab-vllm"
    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    gpu: str = "H100"  # a string: "H100", "A100-80GB:2", "L40S"
    port: int = 8000
    scaledown_window: int = 300  # seconds an idle container stays up (2..3600)
    max_inputs: int = 64  # requests one container takes at once (@modal.concurrent)
    min_containers: int = 0
    max_containers: int = 4
    startup_timeout: int = 900  # seconds for weights to download and vLLM to start
    volume: str = "hf-cache"
    secret: str = "huggingface"  # a Modal Secret holding HF_TOKEN


def build_app(settings: ModalSettings | None = None):
    """(app, serve function, settings) for vLLM's OpenAI server on Modal; needs no credentials."""
    import modal

    s = settings or ModalSettings()
    app = modal.App(s.app_name)
    image = modal.Image.from_registry(VLLM_IMAGE).entrypoint([])  # the image's own entrypoint is `vllm serve`
    cache = modal.Volume.from_name(s.volume, create_if_missing=True)
    cmd = (
        f"vllm serve {s.model} --host 0.0.0.0 --port {s.port} --enable-prefix-caching "
        f"--served-model-name {s.model}"
    )

    def serve() -> None:
        import subprocess

        subprocess.Popen(cmd, shell=True)

    serve.__qualname__ = serve.__name__ = "serve"
    wrapped = modal.web_server(port=s.port, startup_timeout=s.startup_timeout)(serve)
    wrapped = modal.concurrent(max_inputs=s.max_inputs)(wrapped)
    fn = app.function(
        image=image,
        gpu=s.gpu,
        volumes={CACHE: cache},
        secrets=[modal.Secret.from_name(s.secret)],
        scaledown_window=s.scaledown_window,
        min_containers=s.min_containers,
        max_containers=s.max_containers,
        timeout=24 * 3600,
        serialized=True,
    )(wrapped)
    return app, fn, s


def function_report(fn) -> dict:
    """What Modal would run for `fn`, read back from the constructed Function (offline)."""
    from modal._utils.async_utils import synchronizer  # the Function's implementation object

    raw = synchronizer._translate_in(fn)
    spec = raw._spec
    hook = getattr(raw, "_webhook_config", None)
    return {
        "gpu": spec.gpus,
        "volumes": sorted(spec.volumes),
        "secrets": [repr(x) for x in spec.secrets],
        "web_server_port": getattr(hook, "web_server_port", None) if hook else None,
        "web_server_startup_timeout": getattr(hook, "web_server_startup_timeout", None) if hook else None,
        "web_server": bool(hook) and getattr(hook, "web_server_port", 0) > 0,
    }


def settings_row(settings: ModalSettings) -> dict:
    return asdict(settings)


# -- the seeds' keyword arguments and today's names (lab 10's exercise) ----------------------------

RENAMED = dict(fact("modal.renamed"))  # old name -> today's (lab_utils/facts.py; checked against modal)


# The rewrite itself (the reference of 10.modal_upgrade) is the grader's: grader/hidden/lab10.py.


__all__ = [
    "CACHE",
    "RENAMED",
    "ModalSettings",
    "VLLM_IMAGE",
    "build_app",
    "function_report",
    "settings_row",
]
