"""The break cases' stored histories (golden/histories/<break>/<row anchor>.json.gz): what the row a
case targets recorded against the broken proxy, and against the unbroken one (break "none").

A case whose stored history its row's own judgments (history.Judged, judged again by
fixtures/checks/replay.py) fail with the case's text is judged purely in `make test`
(selftests/test_checks_stored.py), and end to end in `make selftest-slow`, where its history is
recorded again and must be judged as the stored one (`make histories` stores the new ones).
A case whose row judges outside the recorded checks (fixtures/checks/: the rules and the checks
replay.py imports) has no stored history: it runs end to end in `make test`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_rl_conformance.fixtures import SUITE_ROOT
from vllm_rl_conformance.fixtures.checks import replay
from vllm_rl_conformance.fixtures.driver import history_file
from vllm_rl_conformance.fixtures.driver.history import Judged
from vllm_rl_conformance.fixtures.results.report import anchor

from . import breaks

HISTORIES = SUITE_ROOT / "golden" / "histories"
UNBROKEN = "none"
# Cases with a stored history that still run end to end in make test, to prove the recording path
# itself: the completions, chat and generate surfaces (keep-acts-like-abort, chat-abort-unmarked,
# spans-collapsed), /pause with /resume and /abort_requests; the sleep, checkpoint and weight routes
# (wake-up-leaves-paused, checkpoint-restore-leaves-paused, weight-update-out-of-order-accepted); in attach
# mode (every inner run of a break case attaches; launch mode: the self-tests that launch,
# test_server_death's launch case among them).
END_TO_END = {"keep-acts-like-abort", "chat-abort-unmarked", "spans-collapsed", "abort-requests-ignores-ids",
              "wake-up-leaves-paused", "checkpoint-restore-leaves-paused", "weight-update-out-of-order-accepted"}


def path(breakage: str, test: str) -> Path:
    return HISTORIES / breakage / f"{anchor(test)}.json.gz"


def stored(case: breaks.Case) -> bool:
    return path(case.breakage, case.test).exists()


def marks(breakage: str, test: str, end_to_end=END_TO_END) -> list:
    """Where a case runs end to end: with a stored history, and not kept `end_to_end`, in make
    selftest-slow only (its stored history is judged in make test)."""
    return [pytest.mark.selftest_slow] if path(breakage, test).exists() and breakage not in end_to_end else []


def params(cases: list[breaks.Case], end_to_end=END_TO_END) -> list:
    """`cases` as pytest params, each marked as marks() says."""
    return [pytest.param(c, id=c.id, marks=marks(c.breakage, c.test, end_to_end)) for c in cases]


def every_case() -> list[breaks.Case]:
    """Every break case of every self-test module, with a stored history."""
    modules = dict.fromkeys(c.selftest for b in breaks.BREAKS for c in b.caught_by)
    every = [c for m in modules for c in breaks.cases(m) if stored(c)]
    return list({(c.breakage, c.test, c.stored_message): c for c in every}.values())  # one per stored history


def unbroken() -> list[Path]:
    """The unbroken proxy's stored histories, one per targeted row."""
    return sorted((HISTORIES / UNBROKEN).glob("*.json.gz"))


def judged_as(events: list, message: str | None) -> tuple[str, str]:
    """How the checks judge a history, in the words two recordings are compared by (first), and the
    finding that says so (second): whether they fail it with `message` (None: whether they pass it)."""
    found = replay.failing(events)
    hit = next((f for f in found if message is not None and message in f), None)
    if hit:
        return f"fails with {message!r}", hit[:300]
    return ("fails otherwise", found[0][:300]) if found else ("passes", "")


def text_of(breakage: str, test: str, message: str | None) -> str | None:
    """What a case's stored history must be failed with: its Catch's `stored`, else `message`."""
    catch = next((c for b in breaks.BREAKS if b.name == breakage for c in b.caught_by if c.test == test), None)
    return (catch.stored or message) if catch is not None and message is not None else message


def compare_recorded(report_dir: Path, breakage: str, message_of: dict[str, str | None]) -> list[str]:
    """Each history an inner run recorded in `report_dir` for which a stored one exists, judged
    as the stored one is (`message_of`: row node id -> the case's text, None for the unbroken
    proxy); returns the differences, each naming the row, the break and the finding."""
    out = []
    for test, message in message_of.items():
        new, old = report_dir / "histories" / path(breakage, test).name, path(breakage, test)
        if not old.exists():
            continue
        if not new.exists():
            out.append(f"{test} under {breakage}: the inner run recorded no history (stored: {old})")
            continue
        text = text_of(breakage, test, message)
        (now, said), (then, _) = judged_as(history_file.read(new)[1], text), judged_as(history_file.read(old)[1], text)
        if now != then:
            out.append(f"{test} under {breakage}: the stored history {then}, the one recorded now {now}"
                       + (f": {said}" if said else ""))
    return out


def store(recorded: Path, into: Path = HISTORIES) -> list[str]:
    """Replaces the stored histories with those of `recorded` (a folder KEEP_HISTORIES named for
    a run of the break cases): each break case's history its row's judgments fail with the case's
    text, and each unbroken row's history they pass. Returns what it did, a line per case."""
    import shutil

    modules = dict.fromkeys(c.selftest for b in breaks.BREAKS for c in b.caught_by)
    lines, keep = [], {}
    for case in (c for m in modules for c in breaks.cases(m)):
        new = recorded / case.breakage / path(case.breakage, case.test).name
        if not new.exists():
            lines.append(f"end to end only  {case.id}: not recorded in this run")
            continue
        verdict, said = judged_as(history_file.read(new)[1], case.stored_message)
        if verdict.startswith("fails with"):
            keep[new] = path(case.breakage, case.test).relative_to(HISTORIES)
            lines.append(f"judged purely    {case.id}")
        else:
            lines.append(f"end to end only  {case.id}: its history {verdict}" + (f": {said}" if said else ""))
    for new in sorted((recorded / UNBROKEN).glob("*.json.gz")):
        events = history_file.read(new)[1]
        verdict, said = judged_as(events, None)
        if not any(isinstance(e, Judged) for e in events):
            verdict, said = "not stored", "the row judges outside the rules"
        elif verdict == "passes":
            keep[new] = Path(UNBROKEN) / new.name
        lines.append(f"unbroken {verdict:10.10s} {new.name.removesuffix('.json.gz')}" + (f": {said}" if said else ""))
    shutil.rmtree(into, ignore_errors=True)
    for new, rel in keep.items():
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(new, into / rel)
    return lines


if __name__ == "__main__":
    import sys

    for line in store(Path(sys.argv[1])):
        print(line)
    print(f"stored in {HISTORIES}")
