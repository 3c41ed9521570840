"""``memgym serve``: expose a model as an OpenAI-compatible server (vLLM on GPU, else builtin)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import threading
from collections.abc import Callable

# Default ports per role, so the policy, answer and judge servers can run side by side.
ROLE_PORTS = {"policy": 8000, "answer": 8001, "judge": 8002}


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
            raise ValueError("--engine vllm needs the vllm package: pip install 'memgym[gpu]'")
        return "vllm"
    if engine == "auto":
        return "vllm" if has_vllm and has_gpu else "builtin"
    raise ValueError(f"unknown engine {engine!r}; expected auto, vllm or builtin")


def check_port(host: str, port: int) -> None:
    """Raise OSError naming ``host:port`` when nothing can listen there (in use, no
    permission, unknown host); checked before a model is loaded."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --port "
                               "(0 = any free port) or --host") from None


def vllm_command(model_path: str, host: str, port: int, served_model_name: str | None) -> list[str]:
    """The ``vllm serve`` command line for a local model dir."""
    cmd = ["vllm", "serve", model_path, "--host", host, "--port", str(port)]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    return cmd


def run_serve(args: argparse.Namespace, *, on_ready: Callable[[str], None] | None = None,
              stop: threading.Event | None = None) -> int:
    """Run the server described by parsed ``args``. With the vllm engine this process is
    replaced by ``vllm serve`` (the command is printed first). With the builtin engine, prints
    ``{"base_url", "model", "role", "engine"}`` as JSON, calls ``on_ready(base_url)``, and serves
    until Ctrl-C or until ``stop`` is set. A ``vllm:`` spec on the builtin engine is served
    with transformers (``hf:``) instead."""
    from memgym.llm.specs import load_backend, parse_spec, resolve_model_path

    try:
        spec = parse_spec(args.model)
        engine = choose_engine(args.engine, vllm_available(), gpu_available() if args.engine == "auto" else False)
    except ValueError as e:  # BackendSpecError is a ValueError too
        raise SystemExit(f"memgym serve: {e}") from e
    port = args.port if args.port is not None else ROLE_PORTS[args.role]
    check_port(args.host, port)  # before any model loads
    if engine == "vllm":
        if spec.kind == "openai":
            raise SystemExit(f"memgym serve: {args.model} is already a server; vllm needs an hf:/vllm: model dir")
        cmd = vllm_command(str(resolve_model_path(spec)), args.host, port, args.served_model_name)
        print(shlex.join(cmd), flush=True)
        os.execvp(cmd[0], cmd)
        return 0  # not reached
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
                    "GPU) execs `vllm serve <dir>`; otherwise memgym's builtin server runs the model in-process "
                    "with transformers (CPU is fine). Point other roles at it with openai:<base_url>#<model>.")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="hf:<dir> | hf:smollm2 | vllm:<dir> (or openai:<url>#<model> to proxy, builtin only)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None,
                   help="port (default by role: policy 8000, answer 8001, judge 8002; 0 = any free port)")
    p.add_argument("--engine", choices=["auto", "vllm", "builtin"], default="auto",
                   help="auto: vllm when installed and a GPU exists, else builtin")
    p.add_argument("--role", choices=sorted(ROLE_PORTS), default="policy",
                   help="which role this server plays; sets the default port")
    p.add_argument("--served-model-name", default=None,
                   help="model name clients send (default: the backend's model id)")
    p.add_argument("--device", default="cpu", help="torch device for the builtin engine (default cpu)")
    p.set_defaults(func=run_serve)
