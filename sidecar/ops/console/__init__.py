"""`dlq-sidecar console`: the DLQ console in the browser, on the DLQ tools' own reading, filtering and
replay code (`sidecar.ops.dlq.*`; one code path with `dlq inspect` and `dlq replay`).

    command      the sub-command's arguments; serving with Hypercorn's trio worker
    app          the Starlette routes, the POST checks, the pages
    context      what the pages share: settings, access, redrives, templates, caches
    access       the token, sessions, CSRF, and the limits of one request
    catalog      which topics are DLQs (prefix rule, format detection), counts and writers
    timeline     dead letters over time in bounded memory, drawn as server-side SVG
    record_view  one record decoded for its page
    redrive      the preview (a dry run) and redrives on their threads, recorded in the log
    templates/   Jinja2 pages; static/ the stylesheet and the one script (progress polling)

Only `command` is imported by the CLI; it imports the rest (Starlette, Hypercorn, Jinja2: the `console`
extra) when the console starts.
"""
