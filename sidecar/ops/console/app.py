"""The console's web app (Starlette, run on trio by Hypercorn): routes, the security checks, the pages.

Owns `build_app` (the routes and the checks every request passes: its docstring): requests into the
DLQ tools' arguments, run on worker threads, and their results into pages.

Imports: the standard library, Starlette, anyio and `sidecar.ops` (no confluent-kafka).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from sidecar.core.errors import KafkaClientError
from sidecar.kafka.tools import ReadConsumer, TopicAdmin
from sidecar.ops.console import access as limits
from sidecar.ops.console.access import SESSION_COOKIE
from sidecar.ops.console.catalog import Catalog, find_dlq_topics
from sidecar.ops.console.context import CATALOG_TTL_S, Console
from sidecar.ops.console.record_view import record_view
from sidecar.ops.console.redrive import new_replay_name, preview, summary_text
from sidecar.ops.console.timeline import Timeline, svg_chart
from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.errors import UsageError
from sidecar.ops.dlq.filters import Filters, filters_from_values
from sidecar.ops.dlq.formats import FORMATS
from sidecar.ops.dlq.inspect import InspectResult, inspect_dlq, inspect_page, read_entry
from sidecar.ops.dlq.originals import Originals
from sidecar.ops.dlq.payloads import PayloadReader, parse_field_filter
from sidecar.ops.dlq.render import payload_preview, written_by
from sidecar.ops.dlq.replay import REPLAY_NAME, ReplayOptions

T = TypeVar("T")
Params = Mapping[str, list[str]]
FILTER_FIELDS = (
    "format",
    "source_topic",
    "source_partition",
    "exception_class",
    "reason",
    "message",
    "since",
    "until",
    "offset_range",
    "field",
)
_SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class _Refused(Exception):
    """A request the console refuses (status, message): a page, never a traceback."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _blocking(fn: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(fn)


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _session(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE)


def _page(request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
    c = _console(request)
    session = _session(request)
    html = c.render(
        template,
        who=c.access.who(session),
        read_only=c.access.read_only,
        csrf=c.access.csrf(session),
        path=request.url.path,
        **values,
    )
    return HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)


def _one(params: Params, name: str) -> str | None:
    values = params.get(name) or []
    return values[-1].strip() if values and values[-1].strip() else None


def _int(params: Params, name: str, default: int, low: int, high: int) -> int:
    text = _one(params, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if not low <= value <= high:
        raise UsageError(f"{name} must be between {low} and {high}, got {value}")
    return value


def filters_of(params: Params, records: list[str] | None = None) -> Filters:
    """The CLI's filters from a query or a form (the same names, `_` for `-`)."""
    formats = [f for f in params.get("format", []) if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise UsageError(f"unknown format {unknown[0]!r}: one of {', '.join(FORMATS)}")
    partitions = []
    for text in params.get("source_partition", []):
        if text.strip():
            if not text.strip().isdigit():
                raise UsageError(f"source partition must be a number, got {text!r}")
            partitions.append(int(text))
    return filters_from_values(
        formats=formats,
        source_topics=[t.strip() for t in params.get("source_topic", [])],
        source_partitions=partitions,
        exception_classes=[c.strip() for c in params.get("exception_class", [])],
        since=_one(params, "since"),
        until=_one(params, "until"),
        offset_range=_one(params, "offset_range"),
        reasons=[r.strip() for r in params.get("reason", [])],
        message_contains=_one(params, "message"),
        records=records or [],
    )


def _payloads_of(c: Console, params: Params) -> PayloadReader | None:
    """The console's reader with the request's decoded-field filters (`field=PATH=VALUE`, as the CLI's
    ``--field``); the console's own when there are none; UsageError without a registry."""
    fields = [parse_field_filter(f.strip()) for f in params.get("field", []) if f.strip()]
    if not fields:
        return c.payloads
    if c.payloads is None:
        raise UsageError(
            "a decoded-field filter needs a schema registry: start the console with --registry"
        )
    return c.payloads.filtered(fields)


def _filter_query(params: Params) -> list[tuple[str, str]]:
    return [(k, v) for k in FILTER_FIELDS for v in params.get(k, []) if v.strip()]


def _cursor_text(cursor: Mapping[int, int] | None) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted((cursor or {}).items()))


def _cursor(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    out = {}
    for part in text.split(","):
        p, sep, o = part.partition(":")
        if not sep or not p.isdigit() or not o.isdigit():
            raise UsageError(f"bad cursor {text!r}")
        out[int(p)] = int(o)
    return out


def _query(request: Request) -> Params:
    return {k: request.query_params.getlist(k) for k in request.query_params}


async def _form(request: Request) -> Params:
    """The POST's form, after the Origin, size and CSRF checks."""
    c = _console(request)
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise _Refused(403, "refused: the request comes from another site (Origin)")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limits.MAX_BODY_BYTES):
        raise _Refused(413, f"refused: a form of more than {limits.MAX_BODY_BYTES} bytes")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.MAX_BODY_BYTES:
            raise _Refused(413, f"refused: a form of more than {limits.MAX_BODY_BYTES} bytes")
    form = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    if not c.access.csrf_ok(_session(request), _one(form, "csrf") or ""):
        raise _Refused(403, "refused: the form's CSRF token is missing or stale; reload the page")
    return form


def _guarded(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refused as exc:
            return _page(request, "error.html", exc.status, message=str(exc))
        except UsageError as exc:
            return _page(request, "error.html", 400, message=str(exc))
        except KafkaClientError as exc:
            return _page(request, "error.html", 502, message=f"Kafka: {exc}")

    return run


# -- pages -----------------------------------------------------------------------------------------


async def topics_page(request: Request) -> Response:
    c = _console(request)

    def find() -> Catalog:
        admin = TopicAdmin(c.props)
        consumer = ReadConsumer(c.props)
        try:
            return find_dlq_topics(admin, consumer, c.settings.prefix)
        finally:
            consumer.close()

    catalog = await _blocking(lambda: c.cached("catalog", CATALOG_TTL_S, find))
    return _page(request, "topics.html", catalog=catalog, prefix=c.settings.prefix)


async def topic_page(request: Request) -> Response:
    c = _console(request)
    topic = request.path_params["topic"]

    def summarize() -> tuple[InspectResult, Timeline, dict[int, tuple[int, int]]]:
        consumer = ReadConsumer(c.props)
        try:
            marks = consumer.watermarks(topic, consumer.partitions(topic))
        finally:
            consumer.close()
        if not marks:
            raise UsageError(f"topic {topic} does not exist (or is not readable)")

        def scan() -> tuple[InspectResult, Timeline]:
            timeline = Timeline()
            result = inspect_dlq(
                c.settings.bootstrap,
                topic,
                Filters(),
                limit=0,
                kafka=c.settings.kafka,
                each=timeline.add,
            )
            return result, timeline

        # The same watermarks: the same records (read_committed), so the same summary.
        result, timeline = c.cached(("summary", topic, tuple(sorted(marks.items()))), 3600, scan)
        return result, timeline, marks

    started = time.monotonic()
    result, timeline, marks = await _blocking(summarize)
    return _page(
        request,
        "topic.html",
        topic=topic,
        result=result,
        marks=marks,
        by_reason=svg_chart(timeline, "reason", "dead letters over time, by reason"),
        by_class=svg_chart(timeline, "class", "dead letters over time, by exception class"),
        elapsed_s=time.monotonic() - started,
    )


async def records_page(request: Request) -> Response:
    c = _console(request)
    topic = request.path_params["topic"]
    params = _query(request)
    filters = filters_of(params)
    size = _int(params, "size", 50, 1, limits.MAX_PAGE_SIZE)
    cursor = _cursor(_one(params, "cursor"))
    payloads = _payloads_of(c, params)

    def read() -> Any:
        consumer = ReadConsumer(c.props)
        originals = Originals(c.props)
        try:
            accept: Callable[[DlqEntry], bool] | None = None
            if payloads is not None:
                reader = payloads

                def decode(entry: DlqEntry) -> bool:
                    # Decoded (and redacted) for the payload column and the decoded-field filter;
                    # a headers-only record from its source record.
                    return reader.read(entry, originals.record(entry))

                accept = decode
            page = inspect_page(
                consumer,
                topic,
                filters,
                cursor=cursor,
                size=size,
                scan_budget=limits.MAX_SCAN_PER_PAGE,
                accept=accept,
            )
            for entry in page.entries:
                originals.check(entry)  # a headers-only record's payload gone from its source
        finally:
            consumer.close()
            originals.close()
        return page

    page = await _blocking(read)
    query = _filter_query(params)
    next_url = None
    if page.next_cursor is not None:
        next_url = "?" + urlencode(
            [*query, ("size", str(size)), ("cursor", _cursor_text(page.next_cursor))]
        )
    return _page(
        request,
        "records.html",
        topic=topic,
        page=page,
        params={k: (params.get(k) or [""])[-1] for k in FILTER_FIELDS},
        formats=FORMATS,
        query=query,
        next_url=next_url,
        first_url="?" + urlencode([*query, ("size", str(size))]),
        size=size,
        written_by=written_by,
        preview_of=payload_preview,
        decoding=c.payloads is not None,
    )


async def record_page(request: Request) -> Response:
    c = _console(request)
    topic = request.path_params["topic"]
    partition, offset = int(request.path_params["partition"]), int(request.path_params["offset"])

    def read() -> Any:
        consumer = ReadConsumer(c.props)
        try:
            entry = read_entry(consumer, topic, partition, offset)
        finally:
            consumer.close()
        if entry is None:
            raise _Refused(404, f"no record at {topic}[{partition}]@{offset}")
        originals = Originals(c.props)
        try:
            original = originals.fetch(entry)  # a headers-only record's original, or why not
        finally:
            originals.close()
        if c.payloads is not None:
            c.payloads.read(entry, None if original is None else original.record)
        return record_view(entry, original)

    view = await _blocking(read)
    return _page(request, "record.html", topic=topic, view=view)


# -- writes ----------------------------------------------------------------------------------------


def _replay_options(c: Console, topic: str, form: Params) -> ReplayOptions:
    scope = _one(form, "scope") or "selected"
    records = [r for r in form.get("record", []) if r.strip()]
    if scope == "selected":
        if not records:
            raise UsageError("no record chosen: tick some records, or choose 'all matching'")
        if len(records) > limits.MAX_SELECTED:
            raise UsageError(f"at most {limits.MAX_SELECTED} records may be chosen at once")
    elif scope == "matching":
        records = []
    else:
        raise UsageError(f"unknown scope {scope!r}")
    limit = _int(form, "limit", limits.MAX_REDRIVE_RECORDS, 1, limits.MAX_REDRIVE_RECORDS)
    rate_text = _one(form, "rate")
    rate = None
    if rate_text is not None:
        try:
            rate = float(rate_text)
        except ValueError:
            raise UsageError(f"rate must be a number, got {rate_text!r}") from None
        if not 0 < rate <= limits.MAX_RATE_PER_S:
            raise UsageError(f"rate must be above 0 and at most {limits.MAX_RATE_PER_S:g}/s")
    name = _one(form, "name") or new_replay_name()
    if not REPLAY_NAME.match(name):
        raise UsageError(f"bad replay name {name!r}: use letters, digits, '.', '_' and '-'")
    return ReplayOptions(
        bootstrap=c.settings.bootstrap,
        dlq_topic=topic,
        name=name,
        filters=filters_of(form, records),
        target_topic=_one(form, "to"),
        rate_per_s=rate,
        max_replays=c.settings.max_replays,
        limit=limit,
        kafka=c.settings.kafka,
        payloads=_payloads_of(c, form) if scope == "matching" else None,
    )


async def preview_page(request: Request) -> Response:
    c = _console(request)
    topic = request.path_params["topic"]
    form = await _form(request)
    options = _replay_options(c, topic, form)
    summary, total = await _blocking(lambda: preview(options))
    carried = [
        (k, v)
        for k in (*FILTER_FIELDS, "record", "scope", "to", "limit")
        for v in form.get(k, [])
        if v.strip()
    ]
    return _page(
        request,
        "preview.html",
        topic=topic,
        options=options,
        summary=summary,
        total=total,
        carried=[*carried, ("name", options.name)],
        rate=_one(form, "rate") or "",
        cli_text=summary_text(summary, options),
    )


async def redrive_start(request: Request) -> Response:
    c = _console(request)
    topic = request.path_params["topic"]
    form = await _form(request)
    if c.access.read_only:
        raise _Refused(403, "refused: this console is read-only")
    who = c.access.who(_session(request))
    if who is None:
        raise _Refused(403, "refused: a redrive needs the console's token (log in first)")
    options = _replay_options(c, topic, form)
    job = c.redrives.start(options, who)
    if job is None:
        raise _Refused(429, f"refused: {limits.MAX_RUNNING_REDRIVES} redrives are running already")
    return RedirectResponse(f"/redrives/{job.id}", status_code=303, headers=_SECURITY_HEADERS)


async def redrive_page(request: Request) -> Response:
    job = _console(request).redrives.get(request.path_params["job"])
    if job is None:
        raise _Refused(404, "no such redrive (the console keeps the last 100)")
    done = job.summary is not None and job.state in ("done", "failed")
    text = summary_text(job.summary, job.options) if done and job.summary is not None else ""
    return _page(request, "redrive.html", job=job, progress=job.progress(), cli_text=text)


async def redrive_progress(request: Request) -> Response:
    job = _console(request).redrives.get(request.path_params["job"])
    if job is None:
        return JSONResponse({"error": "no such redrive"}, status_code=404)
    return JSONResponse(job.progress(), headers={"cache-control": "no-store"})


async def login(request: Request) -> Response:
    c = _console(request)
    form = await _form(request)
    if c.access.read_only:
        raise _Refused(403, "refused: this console is read-only (started without a token)")
    session = c.access.login(_one(form, "token") or "", _one(form, "who") or "")
    if session is None:
        raise _Refused(403, "refused: wrong token")
    back = _one(form, "back") or "/"
    response = RedirectResponse(
        back if back.startswith("/") and not back.startswith("//") else "/", 303
    )
    response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="strict", path="/")
    return response


async def logout(request: Request) -> Response:
    c = _console(request)
    await _form(request)
    c.access.logout(_session(request))
    response = RedirectResponse("/", 303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


async def healthz(_request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


def build_app(console: Console) -> Starlette:
    """The console's ASGI app over `console`'s settings, access rules and redrives.

        GET  /                                   the DLQ topics found (`catalog`)
        GET  /topics/{topic}                     counts, writers and dead letters over time (`timeline`)
        GET  /topics/{topic}/records             the filtered table, a page at a time (`inspect_page`)
        GET  /topics/{topic}/records/{p}/{o}     one record, every header decoded per its format
        POST /topics/{topic}/preview             the dry run of a redrive (`redrive.preview`)
        POST /topics/{topic}/redrive             start a redrive (a session needed)
        GET  /redrives/{id}, /redrives/{id}.json a redrive's page and its progress (polled by console.js)
        POST /login, /logout                     open or close a session with the token

    Reading, filtering and replaying are the DLQ tools' own code (`sidecar.ops.dlq.*`), run on worker
    threads (`anyio.to_thread`); this module only turns requests into their arguments and their results into
    pages. Every POST is checked for its Origin, its size and its CSRF field; a redrive for a session; every
    request's asks against the limits in `access`. Bad input is a 400 page with the CLI's own message.
    """
    from importlib.resources import files

    static = StaticFiles(directory=str(files("sidecar.ops.console") / "static"))
    app = Starlette(
        routes=[
            Route("/", _guarded(topics_page)),
            Route("/healthz", healthz),
            Route("/login", _guarded(login), methods=["POST"]),
            Route("/logout", _guarded(logout), methods=["POST"]),
            Route("/topics/{topic}", _guarded(topic_page)),
            Route("/topics/{topic}/records", _guarded(records_page)),
            Route("/topics/{topic}/records/{partition:int}/{offset:int}", _guarded(record_page)),
            Route("/topics/{topic}/preview", _guarded(preview_page), methods=["POST"]),
            Route("/topics/{topic}/redrive", _guarded(redrive_start), methods=["POST"]),
            Route("/redrives/{job}.json", redrive_progress),
            Route("/redrives/{job}", _guarded(redrive_page)),
            Mount("/static", static, name="static"),
        ]
    )
    app.state.console = console
    return app


__all__ = ["build_app", "filters_of"]
