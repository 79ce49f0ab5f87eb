"""``python -m bench.engine_path [--baseline PATH]``: the consumer engine's delivery path in one process, in CPU.

No broker, no app process, no threads: the pipeline and the consumer engine of this checkout (and of
``--baseline``'s, alternated, each run a child process with that checkout first on the path) take
``--records`` records on 6 partitions straight into their ledgers (``on_messages``), hand them to a
fake app client that answers every request it holds at once, one row of answers per trio step
(``after_round`` after each row), and commit through a source whose ``commit`` returns at once. The
figure is the trio thread's CPU (``time.process_time``) per record from the first hand-over to the
last answer: the scheduler's turns, the hand-out, the pipeline's requests and answers, the ledger.
What the end-to-end bench adds on top (librdkafka, sockets, the app) is not in it, and neither is
the machine's load beyond what it does to this one thread.

    python -m bench.engine_path --baseline /tmp/base --records 60000 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PARTITIONS = 6
ROOT = Path(__file__).resolve().parents[1]


def _child(records: int, batch: bool) -> dict[str, Any]:
    import confluent_kafka
    import trio

    from sidecar.config import parse_config
    from sidecar.core.wire import Answer
    from sidecar.engines.consumer import group as consumer_group
    from sidecar.engines.pipeline import Pipeline
    from sidecar.kafka.source import AssignedPartition

    app_cfg: dict[str, Any] = {"url": "http://127.0.0.1:9/records"}
    if batch:
        app_cfg |= {"mode": "batch", "batch.max.records": 100, "batch.linger.ms": 0}
    config = parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": app_cfg,
            "errors.deadletterqueue.topic.name": "",
            "max.buffered.records.per.partition": records,
        },
        env={},
    )

    class FakePool:
        def __init__(self, after_round: Any = None) -> None:
            self.after_round = after_round
            self.on_error = None

        def abandon(self, _exchange: object) -> None:
            pass

    class FakeApp:
        """Holds each request; `answer_all` answers them, one row, then the round ends."""

        def __init__(self) -> None:
            self.pool = FakePool()
            self.held: list[tuple[list[str], Any]] = []

        def factory(self, _config: Any, *, after_round: Any, on_error: Any) -> FakeApp:
            self.pool = FakePool(after_round)
            return self

        def start_single(self, view: Any, _timeout_s: float, done: Any) -> None:
            self.held.append(([view.delivery_id], done))

        def start_batch(self, views: Any, _timeout_s: float, done: Any) -> None:
            self.held.append(([v.delivery_id for v in views], done))

        def answer_all(self) -> int:
            held, self.held = self.held, []
            for ids, done in held:
                if batch:
                    done({i: Answer("accept") for i in ids})
                else:
                    done(Answer("accept"))
            if held and self.pool.after_round is not None:
                self.pool.after_round()
            return sum(len(ids) for ids, _ in held)

        async def aclose(self) -> None:
            pass

    app = FakeApp()
    engines: list[Any] = []

    def make(parts: Any) -> Any:
        engines.append(consumer_group.ConsumerGroupEngine(parts))
        return engines[0]

    new_api = "app_client" in Pipeline.__init__.__code__.co_varnames
    if new_api:
        pipe = Pipeline(config, make, app_client=app.factory)
    else:
        pipe = Pipeline(config, make)
        pipe.app = app  # type: ignore[assignment]
    engine = engines[0]

    async def commit(_offsets: Any) -> None:
        return None

    engine.source.commit = commit
    messages = [
        [
            confluent_kafka.Message(
                topic="t", partition=p, offset=o, key=b"k%d" % (o % 1000), value=b"v" * 1024
            )
            for o in range(records // PARTITIONS)
        ]
        for p in range(PARTITIONS)
    ]
    total = sum(len(m) for m in messages)
    result: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if new_api:
                pipe.start_requests(nursery)
                await nursery.start(engine._archiver.run)
                nursery.start_soon(engine._scheduler.run)
                nursery.start_soon(engine._committer.run)
            else:
                pipe.start_workers(nursery)
                engine._nursery = nursery
                nursery.start_soon(engine._scheduler)
                nursery.start_soon(engine._committer)
            await engine.on_assigned(
                [AssignedPartition("t", p, 0, None) for p in range(PARTITIONS)]
            )
            await trio.sleep(0.05)
            done = 0
            cpu0, t0 = time.process_time(), time.perf_counter()
            for batch_of in messages:
                engine.on_messages(batch_of)
            engine.messages_taken()
            while done < total:
                done += app.answer_all()
                await trio.lowlevel.checkpoint()
            result["cpu_us_per_record"] = (time.process_time() - cpu0) / total * 1e6
            result["records_per_s"] = total / (time.perf_counter() - t0)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_path", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--baseline", metavar="PATH", help="another checkout, alternated")
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", action="store_true", help="app.mode: batch (100 records)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.records, args.batch)))
        return
    sides = [("new", ROOT)] + ([("old", Path(args.baseline).resolve())] if args.baseline else [])
    figures: dict[str, list[float]] = {name: [] for name, _ in sides}
    for run in range(args.runs):
        for name, root in sides:
            env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{ROOT}"}
            # The script by its path: the other checkout's `bench` package may not have this module.
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
            cmd += ["--records", str(args.records)]
            cmd += ["--batch"] if args.batch else []
            out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            figures[name].append(r["cpu_us_per_record"])
            print(
                f"  run {run + 1} [{name}]: {r['cpu_us_per_record']:.1f} µs/record of CPU, {r['records_per_s']:,.0f} records/s",
                flush=True,
            )
    for name, values in figures.items():
        print(
            f"{name}: median {statistics.median(values):.1f} µs/record ({', '.join(f'{v:.1f}' for v in values)})"
        )
    if "old" in figures:
        ratio = statistics.median(figures["new"]) / statistics.median(figures["old"])
        print(f"new/old CPU per record: {ratio:.3f}")


if __name__ == "__main__":
    main()
