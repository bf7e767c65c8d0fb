"""Measure the demo target/draft pair with real ``mlx_lm.server`` processes over HTTP.

Why: the demo claims that speculative decoding with the built draft is faster and lossless when the
prompt cache is off, that the server's default prompt cache breaks losslessness with a draft
(mlx-lm 0.32.2 bug), and that KV-cache quantization is a lossy variant. This script checks those
claims end to end, as the demo serves them, and prints one table.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/demo_speedup.py [--max-tokens 128] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp_infra.demo_models import DEFAULT_SPEC, build_demo_models  # noqa: E402

PROMPTS = (
    "Hello, how fast is this server?",
    "Write a short story about a cat.",
    "List three colors of the rainbow.",
    "What is the capital of France?",
)
WARMUP_PROMPT = "Warm up the server, please."


@dataclass
class Config:
    """One server variant: its name and the mlx_lm.server flags beyond --model/--host/--port."""

    name: str
    flags: list[str]
    default_cache: bool = False


@dataclass
class Result:
    config: Config
    startup_s: float
    tps: list[float] = field(default_factory=list)
    identical: int = 0
    total: int = 0
    rss_mib: float = 0.0
    error: str = ""


class HTTPStatusError(RuntimeError):
    """The server answered, but not with 200: retrying readiness will not help."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, body: dict, timeout: float = 120.0) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise HTTPStatusError(f"HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        conn.close()


def chat_body(prompt: str, max_tokens: int, **extra: object) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        **extra,
    }


def greedy_ids(port: int, prompt: str, max_tokens: int) -> list[int]:
    """Token ids of a non-streaming greedy completion (from logprobs.content[].id)."""
    resp = post(port, chat_body(prompt, max_tokens, logprobs=True))
    return [int(c["id"]) for c in resp["choices"][0]["logprobs"]["content"]]


def stream_decode_tps(port: int, prompt: str, max_tokens: int) -> tuple[float, str]:
    """Decode rate seen by a streaming client: (tokens - 1) / (last chunk - first chunk)."""
    body = chat_body(prompt, max_tokens, stream=True, stream_options={"include_usage": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120.0)
    t_first = t_last = 0.0
    n_tokens = 0
    text = []
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            msg = json.loads(payload)
            if msg.get("usage"):
                n_tokens = int(msg["usage"]["completion_tokens"])
            for choice in msg.get("choices", []):
                content = (choice.get("delta") or {}).get("content") or ""
                if content:
                    text.append(content)
                    if not t_first:
                        t_first = now
                    t_last = now
    finally:
        conn.close()
    if n_tokens < 2 or t_last <= t_first:
        raise RuntimeError(f"stream too short to time: {n_tokens} tokens")
    return (n_tokens - 1) / (t_last - t_first), "".join(text)


class Server:
    """An mlx_lm.server subprocess bound to 127.0.0.1; ready once a 1-token completion works."""

    def __init__(self, model: Path, flags: list[str], workdir: Path) -> None:
        self.port = free_port()
        hub = workdir / "hf-hub"
        hub.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub))
        argv = [
            sys.executable,
            "-m",
            "mlx_lm",
            "server",
            "--model",
            str(model),
            *flags,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        self.log_path = workdir / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 120.0) -> float:
        deadline = self.t0 + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}\n{self.log_tail()}")
            try:
                post(self.port, chat_body("hi", 1), timeout=30.0)
                return time.perf_counter() - self.t0
            except HTTPStatusError as exc:
                raise RuntimeError(f"{exc}\n{self.log_tail()}") from exc
            except (OSError, http.client.HTTPException):
                time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s\n{self.log_tail()}")

    def log_tail(self, n: int = 6) -> str:
        self._log.flush()
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join("    | " + line for line in lines[-n:])

    def rss_hwm_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        except OSError:
            pass
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def check_identity(
    res: Result,
    port: int,
    baseline: dict[str, list[int]] | None,
    args: argparse.Namespace,
) -> dict[str, list[int]]:
    """Send each prompt `rounds` times (non-streaming) and compare ids with the baseline."""
    ids_by_prompt: dict[str, list[int]] = {}
    for _round in range(args.rounds):
        for prompt in PROMPTS:
            ids = greedy_ids(port, prompt, args.max_tokens)
            ids_by_prompt.setdefault(prompt, ids)
            ref = baseline[prompt] if baseline is not None else ids_by_prompt[prompt]
            res.total += 1
            res.identical += int(ids == ref)
    return ids_by_prompt


def configs(draft: Path, ks: list[int], default_cache_ks: list[int]) -> list[Config]:
    off = ["--prompt-cache-size", "0"]
    out = [Config("target (cache off)", off)]
    for k in ks:
        out.append(
            Config(
                f"draft K={k} (cache off)",
                ["--draft-model", str(draft), "--num-draft-tokens", str(k), *off],
            )
        )
    out.append(Config("target (default cache)", [], default_cache=True))
    for k in default_cache_ks:
        out.append(
            Config(
                f"draft K={k} (default cache)",
                ["--draft-model", str(draft), "--num-draft-tokens", str(k)],
                default_cache=True,
            )
        )
    for bits in (8, 4):
        out.append(
            Config(
                f"kv-bits {bits} (cache off)",
                [*off, "--kv-bits", str(bits), "--quantized-kv-start", "0"],
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5, help="streaming requests timed per config")
    ap.add_argument("--rounds", type=int, default=2, help="times each prompt is checked for ids")
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    ap.add_argument("--default-cache-ks", type=int, nargs="*", default=[2, 4, 6])
    ap.add_argument("--scale", type=float, default=None, help="override extra_layer_scale")
    ap.add_argument("--extra-layers", type=int, default=None, help="override target_extra_layers")
    ap.add_argument("--models-dir", type=Path, default=None, help="reuse/build models here")
    args = ap.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"

    with tempfile.TemporaryDirectory(prefix="demo-speedup-") as tmp:
        workdir = Path(tmp)
        t = time.perf_counter()
        spec = dataclasses.replace(
            DEFAULT_SPEC,
            **{
                k: v
                for k, v in (
                    ("extra_layer_scale", args.scale),
                    ("target_extra_layers", args.extra_layers),
                )
                if v is not None
            },
        )
        paths = build_demo_models(args.models_dir or workdir / "models", spec)
        print(f"built models in {time.perf_counter() - t:.2f}s: {paths['target']}", flush=True)
        results: list[Result] = []
        servers: dict[str, Server] = {}
        try:
            # 1. Start every variant (one at a time, so startup is timed alone), warm it up and
            #    check its greedy ids against the target alone with the cache off.
            baseline: dict[str, list[int]] | None = None
            for cfg in configs(paths["draft"], args.ks, args.default_cache_ks):
                server = Server(paths["target"], cfg.flags, workdir)
                servers[cfg.name] = server
                try:
                    res = Result(cfg, server.wait_ready())
                    # A full request first: the server is warm and, with the default cache,
                    # already holds the chat template prefix, as in real use.
                    post(server.port, chat_body(WARMUP_PROMPT, args.max_tokens))
                    ids = check_identity(res, server.port, baseline, args)
                except Exception as exc:  # report and go on: one broken variant is a finding
                    if baseline is None:
                        raise
                    print(f"  {cfg.name}: FAILED: {exc}", flush=True)
                    results.append(Result(cfg, 0.0, error=str(exc).splitlines()[0]))
                    server.stop()
                    del servers[cfg.name]
                    continue
                if baseline is None:
                    baseline = ids  # the target alone, cache off: the reference greedy output
                results.append(res)
                print(
                    f"  {cfg.name}: startup {res.startup_s:.2f}s, "
                    f"greedy identical {res.identical}/{res.total}",
                    flush=True,
                )
            # 2. Time streaming requests round-robin over the live servers, so a burst of load
            #    from other processes hits every variant alike (this machine is shared).
            live = [r for r in results if not r.error]
            for i in range(args.runs):
                prompt = PROMPTS[i % len(PROMPTS)]
                order = live[i % len(live) :] + live[: i % len(live)]
                for res in order:
                    tps, text = stream_decode_tps(
                        servers[res.config.name].port, prompt, args.max_tokens
                    )
                    if "\ufffd" in text:
                        raise RuntimeError(f"{res.config.name}: U+FFFD in streamed text")
                    res.tps.append(tps)
                print(f"  run {i + 1}/{args.runs} done", flush=True)
            for res in live:
                res.rss_mib = servers[res.config.name].rss_hwm_mib()
        finally:
            for server in servers.values():
                server.stop()

    base_tps = statistics.median(results[0].tps)
    print()
    print(
        f"spec: {spec}\nmax_tokens={args.max_tokens}, timed runs per config={args.runs}, "
        f"greedy checks per config={len(PROMPTS)} prompts x {args.rounds}"
    )
    header = (
        f"{'config':<28} {'decode tok/s (median)':>22} {'speedup %':>10} "
        f"{'greedy identical':>17} {'startup s':>10} {'VmHWM MiB':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        if r.error:
            print(f"{r.config.name:<28} FAILED: {r.error[:80]}")
            continue
        med = statistics.median(r.tps)
        print(
            f"{r.config.name:<28} {med:>22.1f} {100.0 * (med / base_tps - 1.0):>+10.0f} "
            f"{f'{r.identical}/{r.total}':>17} {r.startup_s:>10.2f} {r.rss_mib:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
