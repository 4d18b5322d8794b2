"""The celery-grousset demo: ``make demo`` (``python -m example_project.demo``).

On a fresh clone, with no server running, it

1. starts from an empty ``.demo/`` (SQLite + kombu's server-less ``filesystem://``
   broker + Celery's file result backend), migrates, creates the admin user demo/demo;
2. starts a real ``celery -A proj worker -P prefork -c 2``;
3. publishes ``slow_receipt`` and SIGKILLs the pool process running it, mid-task:
   the broker redelivers the message (acks_late + reject_on_worker_lost), the
   redelivery waits until the claim is older than max_processing_time, then takes
   it over;
4. meanwhile publishes ``send_receipt``, ``book`` and ``charge`` several times each,
   concurrently, with distinct task ids (duplicate deliveries);
5. prints the outcome journal and the counted effects, checks that every key had
   exactly one effect and every caller got the same value, and exits 1 if not.

``DATABASE_URL`` / ``CELERY_BROKER_URL`` run the same story on real servers.
``GROUSSET_DEMO_DIR`` moves the demo folder.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from example_project import use_project_path
from example_project.demo_support import Worker, demo_dir, short, table, wait_for, wipe

#: (order id, e-mail, seat, amount in cents) — one set of duplicate bursts per order
ORDERS = (("1001", "ada@example.com", "12A", 4_990), ("1002", "grace@example.com", "14C", 12_500))
#: deliveries of each call, published at the same instant from as many threads
DUPLICATES = 4
#: slow_receipt's render time; its max_processing_time is 5 s
RENDER_SECONDS = 3.0
RESULT_TIMEOUT = 60.0

_t0 = time.monotonic()


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say(f"\n== {text}")


def at(text: str) -> None:
    """A timeline line, stamped with the seconds since the demo started."""
    say(f"  +{time.monotonic() - _t0:5.1f}s  {text}")


@dataclass
class Call:
    """One logical call — one fingerprint — and the deliveries published for it."""

    task: Any
    args: tuple[Any, ...]
    ids: list[str] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.task.name).rsplit(".", 1)[-1]

    @property
    def fingerprint(self) -> str:
        return str(self.task.grousset_fingerprint(self.args, {}))

    def label(self) -> str:
        return f"{self.name}({', '.join(short(a, 12) for a in self.args)})"

    def record(self) -> Any:
        from celery_grousset.models import Outcome

        return Outcome.objects.filter(processor_id="shop", fingerprint=self.fingerprint).first()

    def collect(self) -> None:
        from celery.result import AsyncResult

        self.results = [AsyncResult(i).get(timeout=RESULT_TIMEOUT, interval=0.1) for i in self.ids]


def publish_together(deliveries: list[tuple[Call, str]]) -> None:
    """Publish every (call, task id) from its own thread, all released at once."""
    barrier = threading.Barrier(len(deliveries))
    errors: list[BaseException] = []

    def send(call: Call, task_id: str) -> None:
        barrier.wait()
        try:
            call.task.apply_async(call.args, task_id=task_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=d) for d in deliveries]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for call, task_id in deliveries:
        call.ids.append(task_id)


def effects_of(call: Call) -> tuple[str, list[str]]:
    """What the call did in the world, counted from the shop's tables: (what, ids)."""
    from shop.models import Booking, ProviderCharge, SentMail

    if call.name in ("send_receipt", "slow_receipt"):
        order, email = call.args[0], call.args[1]
        kind = "PDF receipt" if call.name == "slow_receipt" else "Receipt"
        subject = f"{kind} for order {order}"
        mails = SentMail.objects.filter(subject=subject, recipient=email)
        return "mails sent", [m.message_id for m in mails]
    if call.name == "book":
        rows = Booking.objects.filter(order_id=call.args[0], seat=call.args[1])
        return "bookings", [str(b.pk) for b in rows]
    charges = ProviderCharge.objects.filter(idempotency_key=call.fingerprint)
    asked = sum(c.requests for c in charges)
    return f"provider charges (asked {asked}x)", [c.charge_id for c in charges]


def memo_of(rec: Any) -> Any:
    from celery_grousset import memo

    result = bytes(rec.result) if rec.result is not None else None
    try:
        return memo.decode(result, rec.result_encoding, rec.error, rec.fingerprint)
    except Exception as exc:
        return f"<{type(exc).__name__}>"


def describe_setup() -> None:
    from django.conf import settings
    from kombu.utils.url import maybe_sanitize_url

    from proj.celery import app

    db = settings.DATABASES["default"]
    where = str(db["NAME"])
    if "sqlite" not in db["ENGINE"]:
        where = f"{db.get('HOST')}:{db.get('PORT')}/{where}"
    say("celery-grousset demo")
    say(f"  database  {str(db['ENGINE']).rsplit('.', 1)[-1]}  {where}")
    broker = maybe_sanitize_url(app.conf.broker_url)
    if broker.startswith("filesystem"):
        queue = demo_dir() / "broker" / "queue"
        broker += f"  (no server: message files in {queue})"
    say(f"  broker    {broker}")
    say(f"  results   {maybe_sanitize_url(app.conf.result_backend)}")


def prepare_database() -> None:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", interactive=False, verbosity=0)
    if connection.vendor == "sqlite":
        with connection.cursor() as cur:
            cur.execute("PRAGMA journal_mode=WAL")
    user_model = get_user_model()
    if not user_model.objects.filter(username="demo").exists():
        user_model.objects.create_superuser("demo", "demo@example.com", "demo")
    at("migrated; admin user demo / password demo")


def kill_mid_task(worker: Worker, slow: Call) -> None:
    """Publish the slow call, SIGKILL the pool process that holds its claim."""
    slow.ids.append(str(uuid.uuid4()))
    slow.task.apply_async(slow.args, task_id=slow.ids[0])
    at(f"published {slow.label()}: renders {RENDER_SECONDS:g}s, max_processing_time 5s")

    def holder() -> Any:
        rec = slow.record()
        return rec if rec is not None and rec.status == "in_flight" else None

    rec = wait_for(holder, 30, "slow_receipt to be in flight")
    pid = int(rec.worker.rsplit(":", 1)[1])
    worker.kill_child(pid)
    at(f"in flight on {rec.worker} (fence {rec.fence}): SIGKILL to pool process {pid}, mid-render")

    try:
        again = wait_for(lambda: (r := slow.record()) is not None and r.deliveries >= 2 and r,
                         10, "the broker to redeliver")  # fmt: skip
    except TimeoutError:
        # Not seen with kombu 5.7 (its virtual transports re-put a rejected message), but
        # if a broker loses it the effect would wait for the next delivery: send it.
        slow.ids.append(str(uuid.uuid4()))
        slow.task.apply_async(slow.args, task_id=slow.ids[-1])
        at("the broker did NOT redeliver within 10 s: the demo published a duplicate delivery")
        return
    at(f"the broker redelivered the message (acks_late + reject_on_worker_lost); the claim "
       f"is fresh, so the redelivery is re-queued until it turns stale "
       f"(deliveries={again.deliveries})")  # fmt: skip


def follow_takeover(slow: Call) -> None:
    rec = wait_for(lambda: (r := slow.record()) is not None and r.takeovers >= 1 and r,
                   30, "the takeover")  # fmt: skip
    at(f"claim older than max_processing_time: taken over by {rec.worker} (fence {rec.fence}, "
       f"takeovers={rec.takeovers})")  # fmt: skip
    rec = wait_for(lambda: (r := slow.record()) is not None and r.status == "completed" and r,
                   30, "the takeover to complete")  # fmt: skip
    at(f"{slow.name} completed after the takeover (deliveries={rec.deliveries})")


def report(calls: list[Call]) -> list[str]:
    """Print the journal and the effects; return the failed checks."""
    failures: list[str] = []
    rows, effect_rows = [], []
    for call in calls:
        rec = call.record()
        if rec is None:
            failures.append(f"{call.label()}: no journal record")
            continue
        memo = memo_of(rec)
        rows.append([rec.fingerprint[:12] + "…", call.name, call.args[0], len(call.ids),
                     rec.status, rec.deliveries, rec.takeovers, short(memo, 22)])  # fmt: skip
        what, ids = effects_of(call)
        returned = {str(r) for r in call.results}
        same = len(returned) == 1 and returned == set(ids)
        effect_rows.append([call.label(), what, len(ids), len(call.results),
                            "yes" if same else "NO"])  # fmt: skip
        if len(ids) != 1:
            failures.append(f"{call.label()}: {len(ids)} {what}, expected exactly 1")
        if not same:
            failures.append(f"{call.label()}: callers got {sorted(returned)}, effect {ids}")
        if rec.status != "completed":
            failures.append(f"{call.label()}: journal status {rec.status}")
        if rec.deliveries < len(call.ids):
            failures.append(f"{call.label()}: {rec.deliveries} deliveries < {len(call.ids)} sent")
    step("the outcome journal (celery_grousset_outcome), one row per fingerprint")
    say(table(["fingerprint", "task", "order", "sent", "status", "deliveries", "takeovers",
               "memo"], rows))  # fmt: skip
    say("  sent = messages the demo published; deliveries = claims the journal saw (a duplicate\n"
        "  that found the call in flight was re-queued and counted again)")  # fmt: skip
    step("the effects, counted in the shop's tables")
    say(table(["call", "effect", "count", "results", "same value for all"], effect_rows))
    return failures


def main() -> int:
    run = uuid.uuid4().hex[:4]
    given = [name for name in ("DATABASE_URL", "CELERY_BROKER_URL", "GROUSSET_DEMO_DIR")
             if os.environ.get(name)]  # fmt: skip
    folder = demo_dir()
    wipe(folder)
    os.environ["GROUSSET_DEMO_DIR"] = str(folder)
    os.environ["DJANGO_SETTINGS_MODULE"] = "proj.settings"
    os.environ["CELERY_TASK_DEFAULT_QUEUE"] = f"grousset-demo-{run}"  # this run's own queue
    # A killed pool process's job is declared lost after 2 s instead of 10 s: the demo's
    # redelivery then arrives while the claim is still fresh.
    os.environ.setdefault("CELERY_WORKER_LOST_WAIT", "2")
    use_project_path()
    import django

    django.setup()
    from shop.tasks import book, charge, send_receipt, slow_receipt

    describe_setup()
    step("a fresh start")
    prepare_database()
    worker = Worker(folder / "worker.log", f"demo-{run}")
    failures: list[str] = []
    try:
        seconds = worker.start()
        at(f"worker pid {worker.pid} ready in {seconds:.1f}s: {' '.join(worker.command[2:10])}")
        step("a worker killed mid-task")
        slow = Call(slow_receipt, (f"1003-{run}", "alan@example.com", RENDER_SECONDS))
        kill_mid_task(worker, slow)
        step(f"duplicate deliveries: every call published {DUPLICATES}x at once")
        calls = []
        for order, email, seat, cents in ORDERS:
            oid = f"{order}-{run}"
            calls += [Call(send_receipt, (oid, email)), Call(book, (oid, seat)),
                      Call(charge, (oid, cents))]  # fmt: skip
        publish_together([(c, str(uuid.uuid4())) for c in calls for _ in range(DUPLICATES)])
        at(f"published {DUPLICATES * len(calls)} messages from as many threads "
           f"({len(calls)} calls x {DUPLICATES})")  # fmt: skip
        follow_takeover(slow)
        for call in [*calls, slow]:
            call.collect()
        at("every delivery returned")
        failures = report([*calls, slow])
        slow_rec = slow.record()
        if slow_rec is None or slow_rec.takeovers < 1:
            failures.append("slow_receipt: no takeover recorded")
        else:
            say(f"\n  {slow.name}'s journal record: args_repr {slow_rec.args_repr} (redacted), "
                f"worker {slow_rec.worker}")  # fmt: skip
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        say(f"\nworker log ({worker.log}), last lines:\n{worker.tail()}")
    finally:
        code = worker.stop()
        at(f"worker stopped (exit {code})")
    step("checks")
    if failures:
        for failure in failures:
            say(f"  FAILED: {failure}")
        return 1
    say("  ok: exactly one effect per key, the same value for every delivery, 1 takeover")
    say("\nBrowse the journal:  python manage.py runserver\n"
        "  then open http://127.0.0.1:8000/admin/celery_grousset/outcome/"
        "  (user demo, password demo)")  # fmt: skip
    if given:
        say(f"  (with the same {' and '.join(given)})")
    say(f"  worker log: {worker.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
