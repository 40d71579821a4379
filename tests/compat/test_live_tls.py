"""HTTPS with --ssl-key-file and --ssl-cert-file: a real kvserve (and router) behind a self-signed
certificate made in the test; plain and streamed answers, and llama-server's rules for the flags."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kvserve.args import ConfigError
from kvserve.config import load_config

from .live import start_server


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    crt = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
           .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
           .not_valid_after(now + datetime.timedelta(days=1))
           .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                          critical=False)
           .sign(key, hashes.SHA256()))
    (d / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                  serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    (d / "cert.pem").write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    return d / "key.pem", d / "cert.pem"


def _client(cert_path: Path) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(cert_path)), timeout=120)


def test_https_server(cert: tuple[Path, Path]) -> None:
    key, crt = cert
    srv = start_server("--ssl-key-file", str(key), "--ssl-cert-file", str(crt), "-c", "512", "-np", "1",
                       tls=True)
    try:
        assert srv.url.startswith("https://")
        with _client(crt) as c:  # the certificate is verified against itself
            r = c.get(srv.url + "/health")
            assert r.status_code == 200 and r.json() == {"status": "ok"}
            assert r.headers["Server"] == "llama.cpp" and r.http_version == "HTTP/1.1"
            assert b"Content-Type" in [k for k, _ in r.headers.raw]  # http_wire's names over TLS too
            r = c.post(srv.url + "/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0})
            body = r.json()
            assert r.status_code == 200 and body["tokens_predicted"] == 4 and body["content"]
            with c.stream("POST", srv.url + "/completion",
                          json={"prompt": "Hello", "n_predict": 4, "temperature": 0, "stream": True}) as s:
                assert s.status_code == 200 and s.headers["Content-Type"].startswith("text/event-stream")
                events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
            assert "".join(e["content"] for e in events) == body["content"] and events[-1]["stop"] is True
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
            httpx.get(srv.url.replace("https://", "http://") + "/health", timeout=10)
        assert "server is listening on https://127.0.0.1:" in srv.log()
    finally:
        srv.stop()


def test_https_router(cert: tuple[Path, Path], tmp_path: Path) -> None:
    """The router serves HTTPS; its children stay on plain HTTP on 127.0.0.1 (llama-server's rule)."""
    key, crt = cert
    srv = start_server("--ssl-key-file", str(key), "--ssl-cert-file", str(crt), "--models-dir", str(tmp_path),
                       "-c", "512", "-np", "1", router=True, tls=True)
    try:
        with _client(crt) as c:
            assert c.get(srv.url + "/props").json()["role"] == "router"
            name = c.get(srv.url + "/models").json()["data"][0]["id"]
            r = c.post(srv.url + "/completion", json={"model": name, "prompt": "Hi", "n_predict": 2})
            assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
            args = c.get(srv.url + "/models").json()["data"][0]["status"]["args"]
            assert "--ssl-key-file" not in args and "--ssl-cert-file" not in args
    finally:
        srv.stop()


def test_tls_flag_rules(cert: tuple[Path, Path], tmp_path: Path) -> None:
    key, crt = cert
    env = {"HOME": "/nonexistent"}
    warnings: list[str] = []
    s = load_config(["--ssl-key-file", str(key)], env, warn=warnings.append).server
    assert (s.ssl_key_file, s.ssl_cert_file) == (None, None)  # one alone: plain HTTP, as llama-server
    assert any("needs both --ssl-key-file and --ssl-cert-file" in w for w in warnings)
    s = load_config([], {**env, "LLAMA_ARG_SSL_KEY_FILE": str(key), "LLAMA_ARG_SSL_CERT_FILE": str(crt)},
                    warn=warnings.append).server
    assert (s.ssl_key_file, s.ssl_cert_file) == (str(key), str(crt))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    for k, c in ((key, bad), (bad, crt), (key, tmp_path / "missing.pem")):
        with pytest.raises(ConfigError, match="^error: failed to load the SSL certificate"):
            load_config(["--ssl-key-file", str(k), "--ssl-cert-file", str(c)], env, warn=warnings.append)
