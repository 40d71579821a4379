"""--sleep-idle-seconds on a real server process: sleeping gives the model's memory back to the
OS, and the next request reloads it and answers as before."""

from __future__ import annotations

import time

import httpx

from .live import start_server


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        line = next(ln for ln in f if ln.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def _wait_sleeping(url: str, want: bool, timeout: float = 20.0) -> None:
    t0 = time.time()
    while httpx.get(url + "/props", timeout=10).json()["is_sleeping"] is not want:
        assert time.time() - t0 < timeout
        time.sleep(0.1)


def test_sleeping_unloads_and_a_request_reloads() -> None:
    srv = start_server("--sleep-idle-seconds", "1", "-c", "1024", "-np", "1", "--metrics")
    try:
        body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0}
        first = httpx.post(srv.url + "/completion", json=body, timeout=60).json()
        props = httpx.get(srv.url + "/props", timeout=10).json()
        weights = props["kvserve_memory"]["weight_bytes"]
        assert props["is_sleeping"] is False and weights > 50 << 20
        awake_rss = _rss_bytes(srv.proc.pid)
        _wait_sleeping(srv.url, True)
        asleep_rss = _rss_bytes(srv.proc.pid)
        assert awake_rss - asleep_rss > 0.8 * weights, (awake_rss, asleep_rss, weights)
        assert "llamacpp:tokens_predicted_total 6" in httpx.get(srv.url + "/metrics", timeout=10).text
        again = httpx.post(srv.url + "/completion", json=body, timeout=60).json()
        assert again["content"] == first["content"] and again["tokens_predicted"] == 6
        assert httpx.get(srv.url + "/props", timeout=10).json()["is_sleeping"] is False
        assert "llamacpp:tokens_predicted_total 12" in httpx.get(srv.url + "/metrics", timeout=10).text
        assert "entering sleeping state" in srv.log()
    finally:
        srv.stop()
