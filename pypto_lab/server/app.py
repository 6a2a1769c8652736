"""The OpenAI-compatible HTTP API of the serving twin, a FastAPI app: ``/v1/models``,
``/v1/completions`` and ``/v1/chat/completions`` (streamed over server-sent events or whole),
``/health``, ``/metrics`` (Prometheus), and two of its own: ``/sim/card`` (what is simulated) and
``/sim/requests`` (each request's simulated arrival, TTFT, TPOT and end-to-end latency).

What a request may ask, and what it gets:

* ``max_tokens`` (chat: also ``max_completion_tokens``): at most this many tokens; OpenAI's
  defaults apply when absent (16 for completions, the positions left for chat). Prompt plus
  ``max_tokens`` must fit the model's positions and the card's KV cache, or the answer is a 400.
* ``ignore_eos`` (vLLM's extension, as benchmark clients send it): exactly ``max_tokens`` tokens.
  Without it the answer ends by itself after a ShareGPT-like length (`text.natural_length`),
  ``finish_reason`` "stop", or at ``max_tokens`` ("length").
* ``stream`` and ``stream_options.include_usage``; ``seed`` (moves where the answer's text starts).
* One choice per request (``n`` = 1) and one prompt per completion request; sampling parameters
  (temperature, top_p, ...) are accepted and change nothing: the text is `text.answer`.

Errors are OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON, a field of the wrong type, an empty prompt, ``n`` > 1 or ``max_tokens`` past the positions
or the KV cache; 404 for a model the server does not serve; 429 (with ``Retry-After``) when the
waiting queue is at its bound; 503 while shutting down. Each message names the rule, the value
and a fix.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from .bridge import Engine, Handle, QueueFull, ShuttingDown
from .text import count_tokens, natural_length, piece, render_chat, start_of

COMPLETIONS_DEFAULT_MAX_TOKENS = 16   # OpenAI's documented default for the legacy completions API


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None


def _invalid(errors: list[dict]) -> OpenAIError:
    """A 400 naming the first field pydantic refused, its value and a fix."""
    e = errors[0] if errors else {}
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    if e.get("type") == "missing":
        return OpenAIError(400, f"the field {param!r} is required and missing. Fix: add it to the request body",
                           param=param)
    try:
        shown = json.dumps(e.get("input"))[:80]
    except (TypeError, ValueError):
        shown = repr(e.get("input"))[:80]
    return OpenAIError(400, f"the field {param!r} = {shown} is not valid: {e.get('msg', 'wrong type')}. Fix: send "
                       "it as the OpenAI API documents it", param=param)


async def _parse(request: Request, model: type[BaseModel]) -> BaseModel:
    """The JSON body as ``model``, whatever the Content-Type (clients such as curl send form types)."""
    raw = await request.body()
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f" at line {e.lineno} column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else ""
        raise OpenAIError(400, f"malformed JSON in the request body{where}. Fix: send one JSON object, e.g. "
                          '{"model": "...", "prompt": "..."}') from None
    if not isinstance(obj, dict):
        raise OpenAIError(400, f"the request body is a JSON {type(obj).__name__}, not an object. Fix: send one JSON "
                          "object with the request's fields")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise _invalid(e.errors()) from None


def _text_of(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise OpenAIError(400, f"a message content part of type {p.get('type')!r} is not served: this twin takes "
                              "text only. Fix: send the content as a string or as parts of type 'text'",
                              param="messages.content")
        parts.append(p["text"])
    return "\n".join(parts)


class Twin:
    """What the routes need: the engine, the served model's name and limits, the text seed."""

    def __init__(self, engine: Engine, model_name: str, max_positions: int, seed: int = 0):
        self.engine, self.model_name, self.max_positions, self.seed = engine, model_name, max_positions, seed
        self.created = int(time.time())

    # --- a request's size ---------------------------------------------------------------------

    def _prompt(self, req: CompletionRequest) -> tuple[str, int]:
        p = req.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise OpenAIError(400, f"prompt holds {len(p)} prompts: this server takes one prompt per request. "
                                  "Fix: send one request per prompt", param="prompt")
            p = p[0]
        if isinstance(p, str):
            return p, count_tokens(p)
        return " ".join(map(str, p)), len(p)

    def _size(self, text: str, prompt_tokens: int, max_tokens: int | None, default_max: int | None,
              ignore_eos: bool, seed: int | None, param: str) -> tuple[int, str]:
        """(output tokens, finish reason) of a request, or an `OpenAIError`."""
        if prompt_tokens == 0:
            raise OpenAIError(400, "the prompt is empty (0 tokens). Fix: send a prompt of at least one token",
                              param="prompt" if param == "max_tokens" else "messages")
        room_pos = self.max_positions - prompt_tokens
        pool = self.engine.sched.max_tokens_per_request()
        room = min(room_pos, pool - prompt_tokens)
        if room < 1:
            raise OpenAIError(400, f"the prompt has {prompt_tokens} tokens; {self.model_name} takes at most "
                              f"{self.max_positions} positions and the card's KV cache holds {pool} tokens per request, "
                              "leaving no room for an answer. Fix: shorten the prompt", param="prompt")
        if max_tokens is not None:
            if max_tokens < 1:
                raise OpenAIError(400, f"{param} = {max_tokens}: at least 1 token is generated. Fix: {param}=1 or more",
                                  param=param)
            if prompt_tokens + max_tokens > self.max_positions:
                raise OpenAIError(400, f"{self.model_name}'s maximum context length is {self.max_positions} tokens; "
                                  f"this request asks for {prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, "
                                  f"{max_tokens} in the answer). Fix: {param} <= {room_pos}, or a shorter prompt",
                                  param=param)
            if prompt_tokens + max_tokens > pool:
                raise OpenAIError(400, f"{prompt_tokens} prompt + {max_tokens} answer tokens can never fit the card's "
                                  f"KV cache ({pool} tokens). Fix: {param} <= {pool - prompt_tokens}", param=param)
            limit = max_tokens
        else:
            limit = room if default_max is None else min(default_max, room)
        if ignore_eos:
            return limit, "length"
        n = natural_length(text, self.seed if seed is None else seed)
        return (n, "stop") if n < limit else (limit, "length")

    # --- the routes -----------------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            raise OpenAIError(404, f"the model {name!r} does not exist on this server; it serves {self.model_name!r}. "
                              f"Fix: \"model\": \"{self.model_name}\"", param="model", code="model_not_found")

    async def handle(self, request: Request, req: _Common, chat: bool) -> Response:
        self.check_model(req.model)
        if req.n != 1:
            raise OpenAIError(400, f"n = {req.n}: this server returns one choice per request. Fix: n=1, and send "
                              "several requests", param="n")
        if chat:
            if not req.messages:
                raise OpenAIError(400, "messages is empty. Fix: send at least one message", param="messages")
            text = render_chat([(m.role, _text_of(m.content)) for m in req.messages])
            prompt_tokens = count_tokens(text) if any(_text_of(m.content).strip() for m in req.messages) else 0
            mt, param = (req.max_completion_tokens, "max_completion_tokens") if req.max_completion_tokens is not None \
                else (req.max_tokens, "max_tokens")
            out, reason = self._size(text, prompt_tokens, mt, None, req.ignore_eos, req.seed, param)
        else:
            text, prompt_tokens = self._prompt(req)
            out, reason = self._size(text, prompt_tokens, req.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS,
                                     req.ignore_eos, req.seed, "max_tokens")
        try:
            h = self.engine.submit(prompt_tokens, out, reason, asyncio.get_running_loop())
        except QueueFull as e:
            raise OpenAIError(429, str(e), "rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from None
        except ShuttingDown as e:
            raise OpenAIError(503, str(e), "service_unavailable", code="shutting_down") from None
        start = start_of(text, self.seed if req.seed is None else req.seed)
        usage_in_stream = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return StreamingResponse(self._stream(h, start, chat, usage_in_stream), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": str(h.id)})
        return await self._whole(request, h, start, chat)

    def _usage(self, h: Handle) -> dict[str, int]:
        return {"prompt_tokens": h.prompt_tokens, "completion_tokens": h.emitted,
                "total_tokens": h.prompt_tokens + h.emitted}

    def _id(self, h: Handle, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-{h.id}"

    async def _whole(self, request: Request, h: Handle, start: int, chat: bool) -> Response:
        pieces: list[str] = []
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(h.queue.get(), timeout=1.0)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        self.engine.cancel(h)
                        return Response(status_code=499)
                    continue
                if ev[0] == "token":
                    pieces.append(piece(start, ev[1]))
                elif ev[0] == "end":
                    break
                else:
                    raise OpenAIError(503, ev[1], "service_unavailable", code="shutting_down")
        except asyncio.CancelledError:
            self.engine.cancel(h)
            raise
        text, reason = "".join(pieces), h.finish_reason
        base = {"id": self._id(h, chat), "created": self.created, "model": self.model_name, "usage": self._usage(h)}
        if chat:
            base.update(object="chat.completion", choices=[{"index": 0, "message": {"role": "assistant", "content": text},
                                                            "logprobs": None, "finish_reason": reason}])
        else:
            base.update(object="text_completion", choices=[{"index": 0, "text": text, "logprobs": None,
                                                            "finish_reason": reason}])
        return JSONResponse(base, headers={"X-Request-Id": str(h.id)})

    async def _stream(self, h: Handle, start: int, chat: bool, usage: bool):
        cid = json.dumps(self._id(h, chat))
        head = (f'{{"id":{cid},"object":"{"chat.completion.chunk" if chat else "text_completion"}",'
                f'"created":{self.created},"model":{json.dumps(self.model_name)},"choices":')

        def chunk(content: str | None, reason: str | None, role: bool = False) -> str:
            fr = json.dumps(reason)
            if chat:
                delta = {} if content is None else {"content": content}
                if role:
                    delta = {"role": "assistant", "content": ""}
                body = f'[{{"index":0,"delta":{json.dumps(delta)},"logprobs":null,"finish_reason":{fr}}}]'
            else:
                body = f'[{{"index":0,"text":{json.dumps(content or "")},"logprobs":null,"finish_reason":{fr}}}]'
            return f"data: {head}{body}}}\n\n"

        finished = False
        try:
            if chat:
                yield chunk(None, None, role=True)
            while True:
                ev = await h.queue.get()
                if ev[0] == "token":
                    out = [chunk(piece(start, ev[1]), None)]
                    while not h.queue.empty():      # tokens released together go out in one write
                        nxt = h.queue.get_nowait()
                        if nxt[0] != "token":
                            h.queue.put_nowait(nxt)  # put back: handled next turn (the queue is now empty)
                            break
                        out.append(chunk(piece(start, nxt[1]), None))
                    yield "".join(out)
                elif ev[0] == "end":
                    finished = True
                    tail = chunk(None if chat else "", h.finish_reason)
                    if usage:
                        tail += f'data: {head}[],"usage":{json.dumps(self._usage(h))}}}\n\n'
                    yield tail + "data: [DONE]\n\n"
                    return
                else:
                    finished = True
                    err = {"error": {"message": ev[1], "type": "service_unavailable", "param": None,
                                     "code": "shutting_down"}}
                    yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"
                    return
        finally:
            if not finished:        # the client went away (or the server cancelled the stream)
                self.engine.cancel(h)


def build_app(twin: Twin, card_info: dict[str, Any], *, drain_timeout: float = 30.0) -> FastAPI:
    """The FastAPI app over ``twin``; the engine starts with the app and stops (draining for up to
    ``drain_timeout`` wall seconds) when it shuts down."""
    engine = twin.engine

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not engine.alive:
            engine.start()
        yield
        await asyncio.to_thread(engine.stop, True, drain_timeout)

    app = FastAPI(title="pypto_lab serving twin", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(OpenAIError)
    async def _oai(request: Request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError):
        return _invalid(list(exc.errors())).response()

    @app.get("/health")
    async def health():
        if engine.closing or not engine.alive:
            return JSONResponse({"status": "shutting down" if engine.closing else "engine stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": twin.model_name, "object": "model", "created": twin.created,
                                            "owned_by": "pypto_lab", "max_model_len": twin.max_positions}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await twin.handle(request, await _parse(request, CompletionRequest), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await twin.handle(request, await _parse(request, ChatRequest), chat=True)

    @app.get("/sim/card")
    async def card():
        return {**card_info, **engine.state()}

    @app.get("/sim/requests")
    async def requests_():
        return {"requests": list(engine.records)}

    return app


__all__ = ["COMPLETIONS_DEFAULT_MAX_TOKENS", "OpenAIError", "Twin", "build_app"]
