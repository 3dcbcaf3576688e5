"""Between HTTP and the engine: requests become chat jobs, their events come back to asyncio.

A follow-up sends the whole conversation back, as OpenAI's clients do, and needs no conversation
id: saved readings are found by the tokens they read. A follow-up about a document loads the
document's reading; one of a pasted chat loads the reading saved of its beginning (when that was
long enough to save) and reads only what is new. Either way its question selects again
(serving/requests.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from kvchat.documents import bundle
from kvchat.documents.limits import MAX_FILE_BYTES, SERVER_DOCUMENTS_BYTES
from kvchat.engine import (
    DEFAULT_MAX_TOKENS, AskSettings, Engine, KvLayout, Turn, UserSettings, above_most, ask_settings, form_label, method_of,
)
from kvchat.errors import KvchatError
from kvchat.events import Done, Event
from kvchat.llama import SamplerSettings
from kvchat.policy import DEFAULT_BUDGET, MIN_BUDGET
from kvchat.server.documents import DocumentLibrary, StoredDocument
from kvchat.server.errors import REQUEST_FIELDS, ApiError, api_error
from kvchat.server.schemas import REQUEST_SETTINGS, SETTING_FIELDS, ChatCompletionRequest, ChatMessage, value_schemas
from kvchat.serving.requests import ChatRequest
from kvchat.serving.jobs import ChatJob, QueueFull, ShuttingDown
from kvchat.serving.scheduler import Scheduler
from kvchat.serving.slots import DEFAULT_ROOM

# Builds the scheduler from (engine, sequences, cells per sequence, waiting line, threads, KV layout,
# readings at once).
NewScheduler = Callable[[Engine, int, int, int, int | None, KvLayout, int], Scheduler]


@dataclass(frozen=True)
class ServerLimits:
    model_id: str
    budget: int = DEFAULT_BUDGET  # the default and the most a request may ask for
    max_tokens: int = DEFAULT_MAX_TOKENS
    sequences: int = 8
    max_waiting: int = 16
    max_readings: int = 2  # requests read at once, taking turns a chunk each (each holds a context meanwhile)
    max_body_bytes: int = MAX_FILE_BYTES  # an upload: the most any document is read of, one number for both
    max_documents: int = 64
    max_document_bytes: int = SERVER_DOCUMENTS_BYTES  # memory the uploaded documents may hold, all together
    room: int = DEFAULT_ROOM
    layout: KvLayout = KvLayout()  # flash attention and KV cache types of every context
    # the settings of a request that does not set them (its kv_<setting> fields; system: one that sends no system message)
    defaults: UserSettings = UserSettings()

    @property
    def sequence_cells(self) -> int:
        return self.budget + self.room + self.max_tokens

    @property
    def most(self) -> dict[str, int]:
        """The most a request may ask of a setting this server bounds further than the setting does,
        which is also what it gets when it leaves that setting unset."""
        return {"budget": self.budget, "max_tokens": self.max_tokens}

    @property
    def hints(self) -> dict[str, str]:
        """A request's wrong value of a setting this server bounds further, answered with the values it takes."""
        return {"budget": f"use {MIN_BUDGET} to {self.budget}, or leave it out for {self.budget}"}

    def request_settings(self) -> list[dict[str, Any]]:
        """Each setting a request may set, as this server takes it (GET /v1/settings, which the chat
        page's settings form is made from): its request `field`, `kind` (JSON schema's integer,
        number or boolean, or choice), the `minimum` and `maximum` of the request field, the setting
        and this server (None: no bound), its `choices` (the request field's: those this server
        takes), its `default` here (what the field left out means; None: the engine's own, said in
        the description) and its `description` (the request field's, else the setting's)."""
        request, user = value_schemas(ChatCompletionRequest), value_schemas(UserSettings)
        return [self._request_setting(field, name, request[field], user[name]) for field, name in REQUEST_SETTINGS.items()]

    def _request_setting(self, field: str, name: str, request: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
        """`request`, `user`: the value schemas of the request field and of the setting."""
        taken = request.get("enum")
        most = [bound for bound in (request.get("maximum"), user.get("maximum"), self.most.get(name)) if bound is not None]
        least = [bound for bound in (request.get("minimum"), user.get("minimum")) if bound is not None]
        return {
            "object": "setting", "name": name, "field": field, "label": form_label(name) or name.replace("_", " "),
            "kind": "choice" if taken else request["type"], "minimum": max(least, default=None), "maximum": min(most, default=None),
            "choices": taken, "default": self.most.get(name, getattr(self.defaults, name)),
            "description": request["description"] or user["description"],
        }


class ChatService:
    """The engine, its scheduler and the uploaded documents."""

    def __init__(
        self, engine: Engine, limits: ServerLimits, threads: int | None = None, new_scheduler: NewScheduler = Scheduler
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.threads = threads
        self.scheduler = new_scheduler(
            engine, limits.sequences, limits.sequence_cells, limits.max_waiting, threads, limits.layout, limits.max_readings
        )
        self.documents = DocumentLibrary(limits.max_documents, limits.max_document_bytes)

    def close(self) -> None:
        self.scheduler.close()
        self.engine.close()

    def document_tokens(self, text: str) -> int:
        """Tokens of an upload's text. Any length is answered: one longer than the model's context
        is read streamed (the engine's reading_settings), unless the request names kv_method."""
        return self.engine.model.count_tokens(text)

    # ---- building a job -------------------------------------------------------------------

    def settings_for(self, body: ChatCompletionRequest) -> AskSettings:
        limits = self.limits
        user = _requested(body, limits.defaults)
        budget = limits.budget if body.kv_budget is None else body.kv_budget
        if budget > limits.budget:  # this server's bound; the least, the setting's own (checked as the request was read)
            refused = above_most("budget", budget, limits.budget, "this server's limit", limits.hints["budget"])
            raise ApiError(400, refused.one_line(REQUEST_FIELDS.get), "invalid_kv_budget", "kv_budget")
        max_tokens = body.max_completion_tokens or body.max_tokens or limits.max_tokens
        if max_tokens > limits.max_tokens:
            raise ApiError(400, f"max_tokens {max_tokens} is over this server's limit of {limits.max_tokens}", "max_tokens_too_large", "max_tokens")
        temperature = limits.defaults.temperature if body.temperature is None else body.temperature
        seed = limits.defaults.seed if body.seed is None else body.seed
        sampler = SamplerSettings(temperature=temperature, top_p=body.top_p or SamplerSettings.top_p, seed=seed)
        try:
            # the server's options of a method serve every method a request names: each goes to one that has it
            every_method = {name: getattr(user, name) for name in ("heads", "kernel", "pool", "spans") if getattr(user, name) is not None}
            method = method_of(user.model_copy(update={"budget": budget, **dict.fromkeys(every_method)}), every_method)
            return ask_settings(user, method=method, max_tokens=max_tokens, sampler=sampler, threads=self.threads, layout=limits.layout,
                                system=_system(body.messages) or user.system, kept_cells=limits.sequence_cells - 1)
        except KvchatError as error:
            raise api_error(error) from None

    def request_for(self, body: ChatCompletionRequest, settings: AskSettings) -> ChatRequest:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        if self.limits.defaults.system is not None and _system(body.messages) is None:
            messages.insert(0, {"role": "system", "content": self.limits.defaults.system})
        if body.document_id is not None and body.document_ids is not None:
            raise ApiError(400, "send document_id or document_ids, not both", "invalid_document_ids", "document_ids")
        ids = [body.document_id] if body.document_id is not None else body.document_ids
        if not ids:
            return ChatRequest(settings, messages=tuple(messages))
        field_name = "document_id" if body.document_id is not None else "document_ids"
        document = bundle([self._stored(document_id, field_name).document for document_id in ids])
        turns, question = _turns(body.messages)
        return ChatRequest(settings, document=document, turns=tuple(turns), question=question)

    def read_later(self, stored: StoredDocument) -> None:
        """Read an upload in the background as its questions after a fast first answer need it (its
        passages, or whole: Engine.later_reading), with the server's system prompt and cache layout,
        as soon as the model has nothing else to do: a question asked meanwhile is answered from a
        fast reading (awaiting the rest of a whole reading where that is sooner), the ones after it
        load what was read. Not where the server's questions read retrieval's way: they load nothing."""
        settings = AskSettings(threads=self.threads, layout=self.limits.layout, system=self.limits.defaults.system,
                               read=self.limits.defaults.read, kept_cells=self.limits.sequence_cells - 1)  # as its requests
        later = self.engine.later_reading(stored.document, settings)
        if later is not None:
            self.scheduler.read_later(ChatRequest(settings, document=stored.document), later)

    def document_text(self, document_ids: list[str]) -> dict[str, object]:
        """The text a request about these documents asks about (several: bundled, as in the
        prompt), with its pages: what a source's or a kept range's offsets point into."""
        stored = [self._stored(document_id, "document_ids") for document_id in document_ids]
        document = bundle([each.document for each in stored])
        return {"object": "document.text", "ids": document_ids, "filename": ", ".join(each.filename for each in stored),
                "text": document.text.strip(), "pages": [asdict(page) for page in document.pages]}

    def _stored(self, document_id: str, field_name: str) -> StoredDocument:
        stored = self.documents.find(document_id)
        if stored is None and self.documents.was_removed(document_id):
            raise ApiError(404, f"the document {document_id!r} was removed to make room for newer uploads; upload it again "
                           "with POST /v1/documents", "document_not_found", field_name)
        if stored is None:
            raise ApiError(404, f"no document {document_id!r}; upload it with POST /v1/documents", "document_not_found", field_name)
        return stored

    # ---- running it ---------------------------------------------------------------------------

    async def start(self, body: ChatCompletionRequest) -> Answer:
        """Submit a request; raises ApiError for one refused now (a bad field, a full waiting line,
        a server shutting down). What its reading meets later comes as ApiError from its events."""
        settings = self.settings_for(body)
        request = self.request_for(body, settings)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | KvchatError] = asyncio.Queue()
        job = ChatJob(request, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item))
        try:
            self.scheduler.submit(job)
        except QueueFull:
            raise ApiError(429, "the server is busy; try again shortly", "rate_limit_exceeded",
                           error_type="rate_limit_error", headers={"Retry-After": "2"}) from None
        except ShuttingDown as error:
            raise api_error(error) from None
        return Answer(job, queue)


@dataclass
class Answer:
    """A submitted request: its events, and stop() for when nobody waits for them any more."""

    job: ChatJob
    queue: asyncio.Queue[Event | KvchatError]

    async def events(self) -> AsyncIterator[Event]:
        """The answer's events, ending with Done; an error of its reading is raised as ApiError.
        Leaving early (a client that went away) stops the answer and frees its sequence."""
        try:
            while True:
                item = await self.queue.get()
                if isinstance(item, KvchatError):
                    raise api_error(item)
                yield item
                if isinstance(item, Done):
                    return
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop the job: its reading at the next chunk, its answer after the current step."""
        self.job.cancel.set()


def _requested(body: ChatCompletionRequest, defaults: UserSettings) -> UserSettings:
    """The server's default settings with those the request sets (its kv_<setting> fields, checked as it was read)."""
    given = {name: getattr(body, field) for field, name in SETTING_FIELDS.items() if getattr(body, field) is not None}
    return defaults.model_copy(update=given)


def _system(messages: list[ChatMessage]) -> str | None:
    """The request's own system prompt: its system (or developer) messages, or None."""
    said = [m.text() for m in messages if m.role in ("system", "developer") and m.text().strip()]
    return "\n\n".join(said) if said else None


def _turns(messages: list[ChatMessage]) -> tuple[list[Turn], str]:
    """(user, assistant) pairs and the last user message; system messages are left out (they are
    the document prompt's system prompt: AskSettings.system)."""
    said = [m for m in messages if m.role in ("user", "assistant")]
    if not said or said[-1].role != "user":
        raise ApiError(400, "the last message must be the user's question", "invalid_messages", "messages")
    users, assistants = said[:-1:2], said[1:-1:2]
    if any(m.role != "user" for m in users) or any(m.role != "assistant" for m in assistants):
        raise ApiError(400, "messages must alternate user and assistant, ending with the user", "invalid_messages", "messages")
    return [Turn(u.text(), a.text()) for u, a in zip(users, assistants)], said[-1].text()
