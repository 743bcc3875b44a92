#!/usr/bin/env python3
"""One request at a time through den's HTTP ingress, for BENCHMARKS.md's "Polling before
parking": the round trip as a client of separate router and worker processes sees it.

    python3 tests/python/sequential_latency.py URL [REQUESTS]

Sends REQUESTS (default 2000, after 50 warm-up ones) non-streamed `POST /v1/generate`
requests of one token each, a distinct prompt each, one after the other over one
keep-alive connection, and prints one JSON line: the median and p90 of send → whole
response, in µs. Against a worker whose synthetic engine costs nothing, that is the
ingress, the router, the worker and their sockets. Standard library only.
"""

import http.client
import json
import statistics
import sys
import time
import urllib.parse


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: sequential_latency.py URL [REQUESTS]")
    url = urllib.parse.urlparse(sys.argv[1])
    if url.scheme != "http" or not url.hostname:
        sys.exit(f"sequential_latency.py: {sys.argv[1]!r} is not an http://HOST:PORT URL")
    try:
        n = int(sys.argv[2]) if len(sys.argv) == 3 else 2000
    except ValueError:
        n = 0
    if n < 1:
        sys.exit(f"sequential_latency.py: REQUESTS must be a positive number, not {sys.argv[2]!r}")
    try:
        run(url, n)
    except (OSError, ValueError, http.client.HTTPException) as e:
        sys.exit(f"sequential_latency.py: {url.geturl()}: {e}")


def run(url, n):
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=10)
    samples = []
    for i in range(n + 50):
        body = json.dumps({"prompt": f"request {i}, a prompt of its own", "max_new_tokens": 1})
        t0 = time.perf_counter()
        conn.request("POST", "/v1/generate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            sys.exit(f"request {i}: HTTP {resp.status}: {data[:200]!r}")
        if i >= 50:
            samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    print(json.dumps({
        "requests": n,
        "median_us": round(statistics.median(samples)),
        "p90_us": round(samples[int(len(samples) * 0.9)]),
    }))


if __name__ == "__main__":
    main()
