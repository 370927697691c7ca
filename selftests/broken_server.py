"""A thin HTTP proxy in front of a real vLLM server that breaks exactly one row of
the contract. The suite, attached to the proxy, must fail on the row that is broken.

Run standalone (handy for trying the suite by hand), from the suite's directory:
    PYTHONPATH=.import python -m vllm_rl_conformance.selftests.broken_server \
        --upstream http://127.0.0.1:8000 --break keep-acts-like-abort

The breaks are defined in selftests/breaks.py; this proxy implements those that live in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
from typing import Callable

import aiohttp
from aiohttp import web

from vllm_rl_conformance.selftests.breaks import PROXY, changes_of

BREAKS = changes_of(PROXY)  # break name -> what it changes (selftests/breaks.py)
REFUSALS = {"refuse-while-paused-as-0.33", "refusal-not-retryable", "refused-request-never-ends",
            "resent-request-refused-again", "refused-stream-ends-bare"}
REPORTED = {"reports-0.33.0": "0.33.0", "reports-9.9.0": "9.9.0"}  # what /version answers
# 0.34's checkpoint routes and reset_connector, emulated as its source has them (reporting 0.34.0), and the
# faults of that emulation (selftests/breaks.py).
CHECKPOINT = {"checkpoint-routes-as-0.34", "checkpoint-wait-acts-like-abort", "checkpoint-admits-while-prepared",
              "checkpoint-status-always-200", "checkpoint-restore-again-refused", "checkpoint-resume-while-prepared",
              "checkpoint-prepares-while-asleep", "checkpoint-restore-leaves-paused", "checkpoint-refused-while-paused",
              "reset-connector-invalid-accepted"}
BOOL_WORDS = {"true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n"}  # what FastAPI parses as bool
HANG_S = 600  # "never returns": far beyond any bound of the suite
OVERLAP_S = 0.3  # racing calls are held this long, so a second one surely arrives during the first
SLOW_PAUSE_S = 3.0
SLOW_PATH_S = (0.05, 0.2)  # slow-path: the latency added to each call and to each response chunk
# slow-client: how late each streamed chunk reaches the client (the rest at once when the stream ends): longer
# than the fast engine takes for the longest request its context allows (~7 s at ~300 tokens/s here).
SLOW_CLIENT_S = 8.0
# On exit, handlers still held (a "hang" break) get this long, then are cancelled.
SHUTDOWN_S = 2.0
WEIGHT_PATHS = {"/start_weight_update", "/update_weights", "/finish_weight_update"}
COMPLETION_PATHS = {"/v1/completions", "/v1/chat/completions", "/inference/v1/generate"}
DEV_PATHS = {"/pause", "/resume", "/is_paused", "/server_info"}
VALID_MODES = {"abort", "wait", "keep"}
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
# abort-reported-as-stop rewrites this in completion bodies.
ABORT_REASON = (b'"finish_reason":"abort"', b'"finish_reason":"stop"')


class BrokenProxy:
    def __init__(self, upstream: str, breakage: str):
        """`breakage`: one name of BREAKS, or several joined with '+'."""
        self.breaks = set(breakage.split("+"))
        unknown = self.breaks - set(BREAKS)
        if unknown:
            raise ValueError(f"unknown break {sorted(unknown)}; one of {sorted(BREAKS)}")
        self.upstream = upstream.rstrip("/")
        self.breakage = breakage
        self.fake_paused = False  # for keep-is-a-no-op
        self.paused = False  # the upstream's state as seen through us
        self.refusing = False  # the refusal breaks: a pause(abort|wait) refuses new requests until resume
        self.refuse_after_resume = False  # resent-request-refused-again: the next request after resume
        self.mode: str | None = None  # the mode of the pause the upstream is in, as seen through us
        self.prepared_mode: str | None = None  # the emulated checkpoint (CHECKPOINT): prepared with this mode, or running
        self.asleep = False  # a /sleep answered 200 and no wake_up woke it fully since (0.32 says asleep when paused)
        self.late_request = False  # a completion arrived while paused (late-request-blocks-drain)
        self.in_flight = {"/pause": 0, "/resume": 0}  # calls being answered (the *-hangs breaks)
        self.open_streams: list[dict] = []  # requests being answered (resumed-logprobs-altered)
        self.is_paused_calls = 0
        self.repeated_once = False  # first-keep-resume-repeats-a-token-once has repeated its chunk
        self.latency = random.Random(0)  # slow-path: the same delays each run
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app):
        # A fresh upstream connection per request: vLLM may close a keep-alive connection after an
        # error response, and a reused one would then fail here, not in the server under test.
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
                                             connector=aiohttp.TCPConnector(force_close=True))

    async def _close(self, app):
        await self.session.close()

    def _delay(self) -> float:
        return self.latency.uniform(*SLOW_PATH_S) if "slow-path" in self.breaks else 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path, query = request.path, dict(request.query)
        b = self.breaks
        if "slow-path" in b:
            await asyncio.sleep(self._delay())
        if "no-pause-routes" in b and path in DEV_PATHS:
            return web.json_response({"detail": "Not Found"}, status=404)
        if "before-keep-mode" in b:
            if path == "/pause" and query.get("mode") == "keep":
                return web.json_response({"detail": [{"type": "literal_error", "loc": ["query", "mode"],
                                                      "msg": "Input should be 'abort' or 'wait'", "input": "keep"}]},
                                         status=422)
            if path == "/abort_requests":
                return web.json_response({"detail": "Not Found"}, status=404)
            if path == "/openapi.json":
                return web.json_response(await self._older_description())
        racing = {"/resume": "duplicate-resume-hangs", "/pause": "second-pause-hangs"}
        if racing.get(path) in b:
            if self.in_flight[path]:
                await asyncio.sleep(HANG_S)
            self.in_flight[path] += 1
            try:
                await asyncio.sleep(OVERLAP_S)
                return await self._handle(request, path, query)
            finally:
                self.in_flight[path] -= 1
        return await self._handle(request, path, query)

    async def _handle(self, request: web.Request, path: str, query: dict) -> web.StreamResponse:
        b = self.breaks
        kept = self.paused and self.mode == "keep"
        if path == "/pause" and "abort-spares-frozen" in b and kept and query.get("mode", "abort") == "abort":
            return web.json_response({"status": "paused"})
        if path == "/abort_requests" and "abort-requests-ignored-while-paused" in b and self.paused:
            return web.json_response({"status": "aborted", "aborted": 1})
        if path == "/resume" and "second-keep-cycle-repeats-a-token" in b and kept:
            for stream in self.open_streams:
                stream["keep_resumes"] = stream.get("keep_resumes", 0) + 1
                stream["repeat_next"] = stream["keep_resumes"] == 2
        if path == "/resume" and "first-keep-resume-repeats-a-token-once" in b and kept and not self.repeated_once:
            for stream in self.open_streams:
                stream["repeat_next"] = True
        if path == "/wake_up" and "partial-wake-wakes-fully" in b:
            return await self._forward(request, path, {})
        if path == "/sleep" and "sleep-keep-aborts-frozen" in b and query.get("mode") == "keep":
            query["mode"] = "abort"
        reported = next((REPORTED[x] for x in sorted(b & set(REPORTED))), None)
        if b & (REFUSALS - {"refuse-while-paused-as-0.33"}):  # 0.33's refusal with a fault: judged as 0.33
            reported = reported or REPORTED["reports-0.33.0"]
        if b & CHECKPOINT:
            reported = reported or "0.34.0"
        if path == "/version" and reported:
            return web.json_response({"version": reported})
        if b & CHECKPOINT:
            emulated = await self._checkpoint(request, path, query)
            if emulated is not None:
                return emulated
        if path == "/is_sleeping" and "is-sleeping-false-while-asleep" in b:
            return web.json_response({"is_sleeping": False})
        if path == "/wake_up" and "wake-up-leaves-paused" in b:
            async with self.session.post(self.upstream + path, params=[("tags", t) for t in request.query.getall(
                    "tags", [])]) as up:
                body, status = await up.read(), up.status
            async with self.session.post(self.upstream + "/pause", params={"mode": "keep"}) as up:
                await up.read()
            return web.Response(body=body, status=status, content_type="application/json")
        if path in WEIGHT_PATHS and "weight-update-out-of-order-accepted" in b:
            return web.json_response({"message": "ok"})
        if path == "/abort_requests" and "abort-requests-ignores-ids" in b:
            return await self._forward(request, path, query, body=b"{}")
        if path in COMPLETION_PATHS and self.paused:
            self.late_request = True
        if path == "/pause" and "pause-is-slow" in b:
            await asyncio.sleep(SLOW_PAUSE_S)
        if path == "/pause" and "late-request-blocks-drain" in b and self.late_request \
                and query.get("mode") == "wait":
            await asyncio.sleep(HANG_S)
        if path == "/pause" and "requests-run-while-paused" in b and query.get("mode", "abort") in VALID_MODES:
            self.fake_paused = True
            return web.json_response({"status": "paused"})
        if path == "/pause":
            mode = query.get("mode", "abort")
            if "keep-acts-like-abort" in b and mode == "keep":
                query["mode"] = "abort"
            elif "keep-acts-like-wait" in b and mode == "keep":
                query["mode"] = "wait"
            elif "wait-acts-like-abort" in b and mode == "wait":
                query["mode"] = "abort"
            elif "abort-acts-like-keep" in b and mode == "abort":
                query["mode"] = "keep"
            elif "wait-does-not-drain" in b and mode == "wait":
                query["mode"] = "keep"
            elif "keep-is-a-no-op" in b and mode == "keep":
                self.fake_paused = True
                return web.json_response({"status": "paused"})
            elif "invalid-mode-accepted" in b and mode not in VALID_MODES:
                query["mode"] = "keep"
            elif "invalid-mode-422" in b and mode not in VALID_MODES:
                return web.json_response({"detail": [{"type": "literal_error", "loc": ["query", "mode"],
                                                      "msg": "Input should be 'abort', 'wait' or 'keep'",
                                                      "input": mode}]}, status=422)
            elif "clear-cache-ignored" in b and query.get("clear_cache", "true").lower() == "true":
                query["clear_cache"] = "false"
        elif path == "/resume":
            if "resume-does-nothing" in b:
                return web.json_response({"status": "resumed"})
            self.fake_paused = False
            self.late_request = False
        elif path == "/is_paused":
            self.is_paused_calls += 1
            if "is-paused-lies" in b or ("front-end-misses-pause" in b and self.is_paused_calls % 2 == 0):
                return web.json_response({"is_paused": False})
            if self.fake_paused:
                return web.json_response({"is_paused": True})
        refusal = self._refusal(path, query)
        if refusal is not None:
            return await refusal(request)
        # The state flips before forwarding: never refuse a request sent after resume answered. Sleep
        # pauses the scheduler in its mode; a wake_up with no tag resumes it (one with a tag may not:
        # the upstream is asked once it answered).
        if path in ("/pause", "/sleep") and query.get("mode", "abort") in VALID_MODES:
            self.paused, self.mode = True, query.get("mode", "abort")
        elif path == "/resume" or (path == "/wake_up" and "tags" not in request.query):
            self.paused, self.mode = False, None
        if path in ("/resume", "/wake_up"):
            for stream in self.open_streams:
                stream["resumed"] = True
        if path == "/wake_up" and "tags" in request.query:
            answer = await self._forward(request, path, query)
            async with self.session.get(self.upstream + "/is_paused") as up:
                if (await up.json()).get("is_paused") is False:
                    self.paused, self.mode, self.asleep = False, None, False
            return answer
        if path not in COMPLETION_PATHS:
            answer = await self._forward(request, path, query)
            if answer.status == 200 and path in ("/sleep", "/wake_up"):
                self.asleep = path == "/sleep"
            return answer
        stream = {"path": path, "resumed": False}
        self.open_streams.append(stream)
        try:
            return await self._forward(request, path, query, rewrite=lambda chunk: self._rewrite(stream, chunk))
        finally:
            self.open_streams.remove(stream)

    async def _checkpoint(self, request: web.Request, path: str, query: dict) -> web.StreamResponse | None:
        """vLLM 0.34's checkpoint routes as its source has them (vllm/entrypoints/serve/checkpoint/api_router.py,
        vllm/v1/engine/core.py), over the upstream's pause, and reset_connector on /sleep and
        /release_kv_cache_memory; the answer, or None for a call they leave to the rest of the proxy.
        Unlike 0.34, prepare answers once the drain is complete (0.34: once it started; the rows poll the status)."""
        b, prepared = self.breaks, self.prepared_mode is not None

        def state(code: int, **more) -> web.Response:
            return web.json_response({"state": "prepared" if self.prepared_mode else "running", **more}, status=code)

        if path == "/checkpoint/status":
            return state(200 if prepared or "checkpoint-status-always-200" in b else 503)
        if path == "/checkpoint/prepare":
            mode = query.get("mode", "wait")
            if mode not in VALID_MODES:
                return self._invalid("mode", mode)
            if prepared:
                return state(200)
            if self.asleep and "checkpoint-prepares-while-asleep" not in b:
                return state(400, error="Preparing for a checkpoint requires an awake engine")
            if "checkpoint-refused-while-paused" in b and (await self._upstream("GET", "/is_paused"))["is_paused"]:
                return state(400, error="Cannot prepare while paused")
            sent = "abort" if mode == "wait" and "checkpoint-wait-acts-like-abort" in b else mode
            async with self.session.post(self.upstream + "/pause", params={"mode": sent, "clear_cache": "false"}) as up:
                if up.status != 200:
                    return web.Response(body=await up.read(), status=up.status, content_type="application/json")
            self.paused, self.mode, self.prepared_mode = True, sent, mode
            return state(200)
        if path == "/checkpoint/restore":
            if prepared:
                if "checkpoint-restore-leaves-paused" not in b:
                    await self._upstream("POST", "/resume")
                    self.paused, self.mode = False, None
                    for stream in self.open_streams:
                        stream["resumed"] = True
                self.prepared_mode = None
                return state(200)
            if "checkpoint-restore-again-refused" in b:
                return state(400, error="Cannot restore while the checkpoint state is running")
            return state(200)
        if prepared and path in ("/resume", "/sleep", "/wake_up") and not (
                path == "/resume" and "checkpoint-resume-while-prepared" in b):
            return web.json_response({"error": {"message": f"Cannot {path[1:]} while the checkpoint state is prepared",
                                                "type": "Internal Server Error", "param": None, "code": 500}},
                                     status=500)
        if path in COMPLETION_PATHS and self.prepared_mode in ("abort", "wait") \
                and "checkpoint-admits-while-prepared" not in b:  # refused until restore, as during pause
            return await self._refuse(request, path)
        if path in ("/sleep", "/release_kv_cache_memory") and "reset_connector" in query:
            value = query.pop("reset_connector")  # the upstream (0.32) does not declare it
            if value.lower() not in BOOL_WORDS and "reset-connector-invalid-accepted" not in b:
                return self._invalid("reset_connector", value)
            return None
        if path == "/openapi.json":
            return web.json_response(await self._described_as_0_34())
        return None

    @staticmethod
    def _invalid(param: str, value: str) -> web.Response:
        """A query parameter's validation error as vLLM answers it (400, the parameter named)."""
        return web.json_response({"error": {"message": f"1 validation error:\n  query.{param}: invalid value {value!r}",
                                            "type": "Bad Request", "param": f"query.{param}", "code": 400}}, status=400)

    async def _upstream(self, method: str, path: str) -> dict:
        async with self.session.request(method, self.upstream + path) as up:
            return await up.json()

    async def _described_as_0_34(self) -> dict:
        """The upstream's /openapi.json with 0.34's checkpoint routes and reset_connector."""
        async with self.session.get(self.upstream + "/openapi.json") as up:
            spec = await up.json()
        answer = {"200": {"description": "the checkpoint state"}}
        spec["paths"]["/checkpoint/prepare"] = {"post": {"parameters": [
            {"name": "mode", "in": "query", "schema": {"enum": sorted(VALID_MODES)}}], "responses": answer}}
        spec["paths"]["/checkpoint/restore"] = {"post": {"responses": answer}}
        spec["paths"]["/checkpoint/status"] = {"get": {"responses": answer}}
        for route in ("/sleep", "/release_kv_cache_memory"):
            post = spec["paths"].setdefault(route, {}).setdefault("post", {})
            post.setdefault("parameters", []).append({"name": "reset_connector", "in": "query",
                                                      "schema": {"type": "boolean", "default": True}})
        return spec

    def _refusal(self, path: str, query: dict):
        """The refusal breaks (REFUSALS): 0.33's policy, tracked from the control calls that pass
        (a pause with abort or wait refuses new requests until resume or a full wake; keep and a
        sleep's own pause do not change it); the handler of a request it refuses, or None."""
        if not self.breaks & REFUSALS:
            return None
        if path == "/pause" and query.get("mode", "abort") in VALID_MODES:
            self.refusing = query.get("mode", "abort") != "keep"
        elif path == "/resume" or (path == "/wake_up" and "tags" not in query):
            self.refuse_after_resume = self.refusing and "resent-request-refused-again" in self.breaks
            self.refusing = False
        elif path in COMPLETION_PATHS and (self.refusing or self.refuse_after_resume):
            self.refuse_after_resume = False
            return lambda request: self._refuse(request, path)
        return None

    async def _refuse(self, request: web.Request, path: str) -> web.StreamResponse:
        """What 0.33 answers a request sent while paused (abort|wait), or the fault a break adds."""
        b = self.breaks
        status = 500 if "refusal-not-retryable" in b else 503
        kind = "InternalServerError" if path == "/v1/chat/completions" or status == 500 else "ServiceUnavailableError"
        error = {"message": "Generation is paused. Please retry after it resumes.", "type": kind, "param": None,
                 "code": status}
        if not (await request.json()).get("stream"):
            return web.json_response({"error": {**error, "type": "ServiceUnavailableError" if status == 503 else kind}},
                                     status=status)
        out = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        if "refused-stream-ends-bare" not in b:
            await out.write(b"data: " + json.dumps({"error": error}).encode() + b"\n\n")
        if "refused-request-never-ends" in b:
            await asyncio.sleep(HANG_S)
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    def _rewrite(self, stream: dict, chunk: bytes) -> bytes:
        """What the surface breaks do to a response chunk (each SSE event arrives whole)."""
        b = self.breaks
        if "abort-reported-as-stop" in b:
            chunk = chunk.replace(*ABORT_REASON)
        if stream.get("repeat_next") and chunk.startswith(b"data: {") and chunk.endswith(b"\n\n") \
                and b'"token_ids":[]' not in chunk.replace(b" ", b""):
            stream["repeat_next"] = False
            if not self.repeated_once:
                chunk = chunk + chunk  # the same event again: its tokens are delivered twice
                self.repeated_once = "first-keep-resume-repeats-a-token-once" in b
        edits = [fn for name, fn in self._edits(stream).items() if name in b]
        if not edits:
            return chunk
        lines = []
        for line in chunk.split(b"\n"):
            prefix = b"data: " if line.startswith(b"data: {") else b"" if line.startswith(b"{") else None
            if prefix is not None:
                try:
                    body = json.loads(line[len(prefix):])
                except ValueError:
                    body = None
                if isinstance(body, dict):
                    for edit in edits:
                        edit(body)
                    line = prefix + json.dumps(body).encode()
            lines.append(line)
        return b"\n".join(lines)

    def _edits(self, stream: dict) -> dict:
        path = stream["path"]

        def unmark_chat_abort(body):
            for c in body.get("choices") or []:
                if path == "/v1/chat/completions" and c.get("finish_reason") == "abort":
                    c["finish_reason"] = None

        def spare_sample_1(body):
            for c in body.get("choices") or []:
                if path == "/v1/completions" and c.get("index") == 1 and c.get("finish_reason") == "abort":
                    c["finish_reason"] = "length"

        def collapse_spans(body):
            for c in body.get("choices") or []:
                spans = c.get("weight_versions")
                if spans and len(spans) > 1:
                    c["weight_versions"] = [{"version": spans[-1]["version"], "start": 0, "end": spans[-1]["end"]}]

        def resumed_logprobs(body, change):
            """Replaces every logprob x a stream gets after resume by change(x)."""
            if not stream["resumed"]:
                return
            for c in body.get("choices") or []:
                lp = c.get("logprobs") or {}
                if lp.get("token_logprobs"):
                    lp["token_logprobs"] = [change(x) for x in lp["token_logprobs"]]
                for entry in lp.get("content") or []:
                    entry["logprob"] = change(entry["logprob"])

        def resumed_first_token(body, change):
            """Calls change(choice, logprobs) once, on the first chunk with a token a stream gets after resume."""
            if not stream["resumed"] or stream.get("changed"):
                return
            for c in body.get("choices") or []:
                lp = c.get("logprobs") or {}
                if lp.get("token_logprobs") or lp.get("content"):
                    change(c, lp)
                    stream["changed"] = True
                    return

        def shift_one(c, lp):
            if lp.get("token_logprobs"):
                lp["token_logprobs"][0] -= 0.01
            else:
                lp["content"][0]["logprob"] -= 0.01

        def flip_one(c, lp):
            if lp.get("top_logprobs"):  # completions: {"token_id:ID": logprob}
                top = lp["top_logprobs"][0]
                key = min(top, key=top.get)
                c["token_ids"][0], lp["token_logprobs"][0] = int(key.rpartition(":")[2]), top[key]
            else:  # chat / generate: [{"token"|"token_id", "logprob"}]
                entry = lp["content"][0]
                low = min(entry["top_logprobs"], key=lambda t: t["logprob"])
                c["token_ids"][0] = low.get("token_id", int(str(low.get("token")).rpartition(":")[2]))
                entry["logprob"] = low["logprob"]

        return {"chat-abort-unmarked": unmark_chat_abort, "group-sample-not-aborted": spare_sample_1,
                "spans-collapsed": collapse_spans, "resumed-logprobs-altered": lambda body: resumed_logprobs(body, lambda x: x - 0.25),
                "resumed-logprobs-jitter": lambda body: resumed_logprobs(body, lambda x: x * (1 + 1e-6)),
                "resumed-logprob-shifted": lambda body: resumed_first_token(body, shift_one),
                "resumed-token-flipped": lambda body: resumed_first_token(body, flip_one)}

    async def _older_description(self) -> dict:
        """The upstream's /openapi.json without keep mode and /abort_requests (before-keep-mode)."""
        async with self.session.get(self.upstream + "/openapi.json") as up:
            spec = await up.json()
        spec["paths"].pop("/abort_requests", None)
        for param in spec["paths"].get("/pause", {}).get("post", {}).get("parameters", []):
            if param.get("name") == "mode" and "enum" in param.get("schema", {}):
                param["schema"]["enum"] = [m for m in param["schema"]["enum"] if m != "keep"]
        return spec

    async def _forward(self, request: web.Request, path: str, query: dict, body: bytes | None = None,
                       rewrite: Callable[[bytes], bytes] | None = None) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read() if body is None else body
        async with self.session.request(request.method, self.upstream + path, params=query,
                                        headers=headers, data=body or None) as up:
            out = web.StreamResponse(status=up.status, headers={
                k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}})
            await out.prepare(request)
            if "slow-path" in self.breaks:
                await self._deliver_late(up, out, rewrite, self._delay)
            elif "slow-client" in self.breaks and up.headers.get("content-type", "").startswith("text/event-stream"):
                await self._deliver_late(up, out, rewrite, lambda: SLOW_CLIENT_S, flush_at_end=True)
            else:
                async for chunk in up.content.iter_any():  # stream SSE through as it comes
                    await out.write(rewrite(chunk) if rewrite else chunk)
            await out.write_eof()
            return out

    async def _deliver_late(self, up, out: web.StreamResponse, rewrite, delay, flush_at_end: bool = False) -> None:
        """Each chunk is written `delay()` s after it arrived, never before the chunk before it;
        reading goes on meanwhile, so the delays do not add up over a stream (slow-path). With
        `flush_at_end` (slow-client), what is left is written at once when the server ends the
        stream: a client far behind a fast engine, whose short requests arrive whole."""
        loop, queue, ended = asyncio.get_running_loop(), asyncio.Queue(), asyncio.Event()

        async def read():
            due = 0.0
            try:
                async for chunk in up.content.iter_any():
                    due = max(due, loop.time() + delay())
                    queue.put_nowait((due, chunk))
            finally:
                ended.set()
                queue.put_nowait(None)

        async def until(due):
            if flush_at_end:
                try:
                    await asyncio.wait_for(ended.wait(), max(0.0, due - loop.time()))
                except asyncio.TimeoutError:
                    pass
            else:
                await asyncio.sleep(max(0.0, due - loop.time()))

        reader = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                await until(item[0])
                await out.write(rewrite(item[1]) if rewrite else item[1])
            await reader  # its error, if reading failed
        finally:
            reader.cancel()


class ProxyThread:
    """Runs a BrokenProxy on 127.0.0.1 (free port) in a background thread."""

    def __init__(self, upstream: str, breakage: str):
        self.proxy = BrokenProxy(upstream, breakage)
        self.loop = asyncio.new_event_loop()
        self.url: str | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"proxy-{breakage}", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.proxy.app(), shutdown_timeout=SHUTDOWN_S)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())
        pending = asyncio.all_tasks(self.loop)  # handlers cleanup gave up on: end them before closing
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def __enter__(self) -> "ProxyThread":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--break", dest="breakage", default="none",
                    help="one of " + ", ".join(sorted(BREAKS)) + "; several joined with '+'")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    web.run_app(BrokenProxy(args.upstream, args.breakage).app(), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
