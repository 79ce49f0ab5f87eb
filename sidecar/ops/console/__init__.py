"""`dlq-sidecar console`: the DLQ console in the browser, on the DLQ tools' own reading, filtering and
replay code (`sidecar.ops.dlq.*`; one code path with `dlq inspect` and `dlq replay`).

Owns nothing of its own here: `command` (the sub-command; serving with Hypercorn's trio worker), `app`,
`context`, `access`, `catalog`, `timeline`, `record_view`, `redrive`, the templates and static files.
Only `command` is imported by the CLI; it imports the rest (Starlette, Hypercorn, Jinja2: the `console`
extra) when the console starts.
"""
