"""A test LMS: the platform side of LTI 1.3 and 1.1 launches, served on localhost (another site
than the hub's 127.0.0.1, as a real LMS is), with its own RSA key and JWKS.

Its pages do what Canvas or Moodle do in the browser: a launch page posts the OIDC login
initiation to the hub, the authorization endpoint the hub redirects to signs an id_token and
form-posts it to the hub's launch URL; an LTI 1.1 launch page form-posts OAuth 1 signed
parameters. A launch's `mode` makes it go wrong the ways tests need: signed with another key,
expired, for another tool (client id), a replay of the last good id_token, an LTI 1.1 parameter changed after signing.
"""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlparse

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from oauthlib.oauth1 import SIGNATURE_TYPE_BODY, Client

from .harness import free_port

CLIENT_ID = "fgpu-hub-client"
DEPLOYMENT_ID = "deployment-1"
KEY_ID = "lms-key-1"
CONSUMER_KEY, CONSUMER_SECRET = "fgpu-consumer", "fgpu-consumer-secret"
LTI = "https://purl.imsglobal.org/spec/lti/claim"
INSTRUCTOR = "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"
LEARNER = "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner"
INSTITUTION_INSTRUCTOR = "http://purl.imsglobal.org/vocab/lis/v2/institution/person#Instructor"


class Platform:
    """The test LMS, serving at `url` until `close()`; launches go to the hub at `hub_url`."""

    def __init__(self, hub_url: str):
        self.hub_url = hub_url
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.issued: list[str] = []
        port = free_port()
        self.url = f"http://localhost:{port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def jwks(self) -> dict:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": KEY_ID, "alg": "RS256", "use": "sig"}]}

    def launch13_url(self, user: str, context: str, roles: list[str], mode: str = "good") -> str:
        hint = json.dumps({"user": user, "context": context, "roles": roles, "mode": mode})
        return f"{self.url}/launch13?{urlencode({'hint': hint})}"

    def launch11_url(self, user: str, context: str, roles: str, mode: str = "good") -> str:
        query = {"user": user, "context": context, "roles": roles, "mode": mode}
        return f"{self.url}/launch11?{urlencode(query)}"

    def id_token(self, hint: dict, nonce: str) -> str:
        """The signed id_token of a launch, as `hint['mode']` wants it."""
        if hint["mode"] == "replay":
            return self.issued[-1]
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": "another-tool" if hint["mode"] == "other-client" else CLIENT_ID,
            "sub": hint["user"],
            "iat": now - 300 if hint["mode"] == "expired" else now,
            "exp": now - 60 if hint["mode"] == "expired" else now + 300,
            "nonce": nonce,
            f"{LTI}/version": "1.3.0",
            f"{LTI}/message_type": "LtiResourceLinkRequest",
            f"{LTI}/deployment_id": DEPLOYMENT_ID,
            f"{LTI}/target_link_uri": f"{self.hub_url}/hub",
            f"{LTI}/resource_link": {"id": "link-1"},
            f"{LTI}/roles": hint["roles"],
            f"{LTI}/context": {"id": hint["context"], "label": "CS101", "title": "GPUs 101"},
        }
        key = self.other_key if hint["mode"] == "bad-signature" else self.key
        token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": KEY_ID})
        if hint["mode"] == "good":
            self.issued.append(token)
        return token

    def lti11_fields(self, query: dict) -> list[tuple[str, str]]:
        """An LTI 1.1 launch's form fields, OAuth 1 signed with the consumer's secret."""
        params = {
            "lti_message_type": "basic-lti-launch-request",
            "lti_version": "LTI-1p0",
            "resource_link_id": "link-11",
            "user_id": query["user"],
            "context_id": query["context"],
            "roles": query["roles"],
        }
        client = Client(
            CONSUMER_KEY, client_secret=CONSUMER_SECRET, signature_type=SIGNATURE_TYPE_BODY
        )
        _, _, body = client.sign(
            f"{self.hub_url}/hub/lti/launch",
            http_method="POST",
            body=urlencode(params),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        fields = parse_qsl(body)
        if query["mode"] == "forged-role":
            # A student who edits the signed form to make themselves the instructor.
            fields = [(k, "Instructor" if k == "roles" else v) for k, v in fields]
        return fields

    def _handler(self):
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlparse(self.path)
                query = dict(parse_qsl(url.query))
                if url.path == "/jwks":
                    return self._send(json.dumps(platform.jwks()), "application/json")
                if url.path == "/launch13":
                    hint = json.loads(query["hint"])
                    return self._form(
                        f"{platform.hub_url}/hub/lti13/oauth_login",
                        [
                            ("iss", platform.url),
                            ("login_hint", hint["user"]),
                            ("target_link_uri", f"{platform.hub_url}/hub"),
                            ("client_id", CLIENT_ID),
                            ("lti_deployment_id", DEPLOYMENT_ID),
                            ("lti_message_hint", query["hint"]),
                        ],
                    )
                if url.path == "/authorize":
                    assert query["client_id"] == CLIENT_ID and query["response_mode"] == "form_post"
                    token = platform.id_token(json.loads(query["lti_message_hint"]), query["nonce"])
                    fields = [("id_token", token), ("state", query["state"])]
                    return self._form(query["redirect_uri"], fields)
                if url.path == "/launch11":
                    fields = platform.lti11_fields(query)
                    return self._form(f"{platform.hub_url}/hub/lti/launch", fields)
                self.send_error(404)

            def _form(self, action: str, fields: list[tuple[str, str]]) -> None:
                """An auto-submitting form post, as an LMS's launch page is."""
                inputs = "".join(
                    f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                    for k, v in fields
                )
                page = (
                    f'<html><body><form id="launch" method="post" action="{html.escape(action)}">'
                    f"{inputs}</form><script>document.getElementById('launch').submit()"
                    f"</script><p>Launching {uuid.uuid4().hex[:6]}</p></body></html>"
                )
                self._send(page, "text/html")

            def _send(self, text: str, kind: str) -> None:
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
