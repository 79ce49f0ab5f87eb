"""``python -m bench.record_path [--checkout PATH]``: the files and calls one record's path takes.

One record goes through the consumer engine and the pipeline of a checkout (this one, or PATH's,
run as a child process with that checkout first on the path): no broker, no app process, no
threads -- a fake app client answers each request at once, the source's commit returns at once and
the DLQ writer confirms at once. `sys.setprofile` traces the trio thread from the record's intake
(``on_messages``) to the commit past it, twice: accepted, and rejected to the DLQ. Counted: the
sidecar's files whose functions ran, and the calls from a function of one file to a function of
another (distinct caller -> callee pairs, and all of them), and of those the ones between the pipeline's
files (``sidecar/engines/*.py``) and the consumer engine's; calls inside a file and C functions
are not counted, nor the scheduler's idle turns before the record arrives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _child(answer_word: str) -> dict[str, Any]:
    import confluent_kafka
    import trio

    from sidecar.config import parse_config
    from sidecar.core.wire import Answer
    from sidecar.engines.pipeline import Pipeline
    from sidecar.kafka.source import AssignedPartition

    try:
        from sidecar.engines.consumer import group as consumer_group
    except ImportError:  # the flat layout before the engines had subpackages
        from sidecar.engines import consumer_group  # type: ignore[no-redef]

    import sidecar

    sidecar_dir = str(Path(sidecar.__file__).resolve().parent) + os.sep
    config = parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": {"url": "http://127.0.0.1:9/records"},
            "errors.deadletterqueue.topic.name": "dlq.t",
            "commit.interval.ms": 50,
        },
        env={},
    )

    class FakePool:
        def __init__(self, after_round: Any = None) -> None:
            self.after_round = after_round

        def abandon(self, _exchange: object) -> None:
            pass

    class FakeApp:
        """Answers each request as soon as it is started, then ends the round."""

        def __init__(self) -> None:
            self.pool = FakePool()

        def factory(self, _config: Any, *, after_round: Any, on_error: Any) -> FakeApp:
            self.pool = FakePool(after_round)
            return self

        def start_single(self, view: Any, _timeout_s: float, done: Any) -> None:
            done(Answer(answer_word))  # type: ignore[arg-type]
            self.pool.after_round()

        async def aclose(self) -> None:
            pass

    app = FakeApp()
    engines: list[Any] = []

    def make(parts: Any) -> Any:
        engines.append(consumer_group.ConsumerGroupEngine(parts))
        return engines[0]

    pipe = Pipeline(config, make, app_client=app.factory)
    engine = engines[0]
    committed: list[int] = []
    done = trio.Event()

    async def commit(offsets: Any) -> None:
        committed.extend(o.offset for o in offsets)
        if 1 in committed:
            done.set()

    async def dlq_write(_failed: Any, _topic: str) -> bool:
        return True

    engine.source.commit = commit
    pipe.dlq.write = dlq_write  # type: ignore[method-assign]
    pipe._flags.dlq_ready = True  # what `Pipeline.run` sets once the DLQ topics are checked
    edges: dict[tuple[str, str], int] = {}
    files: set[str] = set()

    def where(frame: Any) -> str | None:
        name = frame.f_code.co_filename
        return name[len(sidecar_dir) :] if name.startswith(sidecar_dir) else None

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event != "call":
            return
        callee = where(frame)
        if callee is None:
            return
        files.add(callee)
        back = frame.f_back
        caller = where(back) if back is not None else None
        if caller is not None and caller != callee:
            key = (
                f"{caller}:{back.f_code.co_qualname}",
                f"{callee}:{frame.f_code.co_qualname}",
            )
            edges[key] = edges.get(key, 0) + 1

    message = confluent_kafka.Message(topic="t", partition=0, offset=0, key=b"k", value=b"v")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            pipe.start_requests(nursery)
            await nursery.start(engine._archiver.run)
            nursery.start_soon(engine._scheduler.run)
            nursery.start_soon(engine._committer.run)
            nursery.start_soon(pipe._dlq_step.summary.run)
            await engine.on_assigned([AssignedPartition("t", 0, 0, None)])
            await trio.sleep(0.2)
            threading_profile = sys.getprofile()
            sys.setprofile(profile)
            try:
                engine.on_messages([message])
                engine.messages_taken()
                with trio.fail_after(10):
                    await done.wait()
            finally:
                sys.setprofile(threading_profile)
            nursery.cancel_scope.cancel()

    trio.run(main)

    def side(name: str) -> str:
        engine = name.startswith(("engines/consumer/", "engines/consumer_"))
        return "engine" if engine else "pipeline" if name.startswith("engines/") else "other"

    seam = [(a, b) for a, b in edges if {side(a), side(b)} == {"engine", "pipeline"}]
    return {
        "seam": sorted(f"{a} -> {b}" for a, b in seam),
        "files": sorted(files),
        "edges": sorted(f"{a} -> {b}" for a, b in edges),
        "calls": sum(edges.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.record_path", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--checkout", metavar="PATH", help="another checkout to trace")
    parser.add_argument("--list", action="store_true", help="print the files and the calls")
    parser.add_argument("--child", metavar="ANSWER", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return
    root = Path(args.checkout).resolve() if args.checkout else ROOT
    for label, word in (("accepted and committed", "accept"), ("rejected to the DLQ", "reject")):
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", word]
        out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{label}: {len(r['files'])} files, {len(r['edges'])} distinct calls between files"
            f" ({r['calls']} in all), {len(r['seam'])} of them between the pipeline and the engine"
        )
        for edge in r["seam"]:
            print("    seam:", edge)
        if args.list:
            for name in r["files"]:
                print("   ", name)
            for edge in r["edges"]:
                print("   ", edge)


if __name__ == "__main__":
    main()
