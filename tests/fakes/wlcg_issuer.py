"""A WLCG token issuer on loopback for the tests: serves its OpenID configuration and JWKS
(an RSA and an EC P-256 key) and mints tokens with them.

    with Issuer() as iss:
        iss.url                                  # http://127.0.0.1:PORT/ (the `iss` claim)
        iss.mint(sub="alice", scope="storage.stage:/data", aud="https://carousel.test")
        iss.fetches                              # JWKS fetches so far
        iss.down = True                          # every request answers 503"""
import functools
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa


@functools.cache
def _first_keys():
    """The keys every issuer starts with, made once a process: an RSA key costs about 65 ms of
    CPU, and the suite starts an issuer in some forty tests. Each issuer keeps its own dict."""
    return {"rsa-1": ("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            "ec-1": ("ES256", ec.generate_private_key(ec.SECP256R1()))}


class Issuer:
    def __init__(self):
        self.keys = dict(_first_keys())
        self.fetches = 0
        self.down = False
        self._httpd = None

    def __enter__(self):
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.issuer = self
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self):
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def jwks(self):
        out = []
        for kid, (alg, private) in self.keys.items():
            jwk = json.loads((jwt.algorithms.RSAAlgorithm if alg == "RS256" else jwt.algorithms.ECAlgorithm)
                             .to_jwk(private.public_key()))
            out.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
        return {"keys": out}

    def mint(self, *, sub="alice", scope="storage.stage:/", aud="https://carousel.test", kid="rsa-1",
             iss=None, exp_in=600, ver="1.0", groups=None, **extra):
        alg, private = self.keys[kid] if kid in self.keys else ("RS256", self.keys["rsa-1"][1])
        now = int(time.time())
        claims = {"iss": iss or self.url, "sub": sub, "aud": aud, "iat": now, "nbf": now, "exp": now + exp_in,
                  "jti": str(uuid.uuid4()), "wlcg.ver": ver, **extra}
        if scope is not None:
            claims["scope"] = scope
        if groups is not None:
            claims["wlcg.groups"] = groups
        return jwt.encode(claims, private, algorithm=alg, headers={"kid": kid})


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        issuer = self.server.issuer
        if issuer.down:
            return self._send(503, {"error": "down"})
        if self.path == "/.well-known/openid-configuration":
            return self._send(200, {"issuer": issuer.url, "jwks_uri": issuer.url + "jwks"})
        if self.path == "/jwks":
            issuer.fetches += 1
            return self._send(200, issuer.jwks())
        self._send(404, {})

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
