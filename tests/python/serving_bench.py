#!/usr/bin/env python3
"""Concurrent streamed completions against an OpenAI-compatible server: aggregate decode
tokens/s and inter-token latency, for BENCHMARKS.md's "Serving a real model".

    python3 tests/python/serving_bench.py URL MODEL CONCURRENCY [ROUNDS]

Each of CONCURRENCY clients streams ROUNDS completions (default 2) of 64 tokens
(temperature 0, ignore_eos, a distinct prompt each), all started together. Prints one
JSON line: completion tokens, wall seconds, aggregate tokens/s, the median and p90
gap between a stream's consecutive content chunks (ms), and the median and p90 time to
the first content chunk (ms). The same script measures den and
llama.cpp's server, one after the other, on the same machine. Standard library only.
"""

import json
import statistics
import sys
import threading
import time
import urllib.request

WORDS = ["river", "stone", "garden", "winter", "lantern", "harbour", "orchard", "meadow"]


def stream(url, model, prompt, gaps, tokens, ttfts):
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": 64, "temperature": 0,
        "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    last = None
    sent = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage")
            if usage:
                tokens.append(usage["completion_tokens"])
            choices = event.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.monotonic()
                if last is not None:
                    gaps.append((now - last) * 1e3)
                else:
                    ttfts.append((now - sent) * 1e3)
                last = now


def main():
    url, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    gaps, tokens, ttfts = [], [], []

    def client(i):
        for r in range(rounds):
            words = " ".join(WORDS[(i + r + k) % len(WORDS)] for k in range(12))
            stream(url, model, f"Story {i}-{r}: the {words}", gaps, tokens, ttfts)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    def p50(v):
        return round(statistics.median(v), 1) if v else None

    def p90(v):
        return round(sorted(v)[int(len(v) * 0.9)], 1) if v else None

    print(json.dumps({
        "concurrency": n,
        "completion_tokens": sum(tokens),
        "wall_s": round(wall, 2),
        "tokens_per_s": round(sum(tokens) / wall, 1),
        "itl_p50_ms": p50(gaps),
        "itl_p90_ms": p90(gaps),
        "ttft_p50_ms": p50(ttfts),
        "ttft_p90_ms": p90(ttfts),
    }))


if __name__ == "__main__":
    main()
