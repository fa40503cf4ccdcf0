#!/usr/bin/python3
"""test_oci_token.py - a tiny Bearer token service for tests/test_oci.c (Debian's python3-jwt).

Usage: test_oci_token.py KEY.pem CERT.pem USER PASSWORD
Listens on a free loopback port, prints it on stdout ("PORT\\n") and serves GET /token?service=&
scope=...: with Basic USER:PASSWORD it grants every scope asked for, signed RS256 with KEY (the
registry trusts CERT through rootcertbundle, and finds the key by its libtrust key id in "kid");
without credentials or with wrong ones it answers 401.  Runs until killed.
"""
import base64
import hashlib
import http.server
import json
import sys
import time
import urllib.parse
import uuid

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization

ISSUER = "nwc-test-issuer"


def libtrust_kid(cert_pem):
    """docker/libtrust's key id: base32 of the first 240 bits of sha256(SPKI DER), in 4s."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    b32 = base64.b32encode(hashlib.sha256(spki).digest()[:30]).decode()
    return ":".join(b32[i:i + 4] for i in range(0, len(b32), 4))


def main():
    key_path, cert_path, user, password = sys.argv[1:5]
    key = open(key_path, "rb").read()
    kid = libtrust_kid(open(cert_path, "rb").read())
    want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path != "/token" or self.headers.get("Authorization") != want:
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}')
                return
            q = urllib.parse.parse_qs(url.query)
            access = []
            for scope in q.get("scope", []):
                kind, name, actions = scope.split(":")
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
            now = int(time.time())
            claims = {"iss": ISSUER, "sub": user, "aud": q.get("service", [""])[0],
                      "exp": now + 300, "nbf": now - 10, "iat": now, "jti": str(uuid.uuid4()),
                      "access": access}
            token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})
            body = json.dumps({"token": token, "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
