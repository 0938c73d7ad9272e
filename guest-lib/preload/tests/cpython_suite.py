#!/usr/bin/env python3
"""Runs CPython's own socket test suites (Debian libpython3.11-testsuite)
and records each test's outcome, for guest-lib/preload/tests/cpython.rs,
which runs it over the kernel and under the preload layer.

A test that hangs is stopped (faulthandler ends the process after
--timeout seconds), recorded as "hang", and the run goes on in a new
process without the tests already done.

    cpython_suite.py --out results.json test.test_socket test.test_select

writes {"tests": {id: outcome}, "why": {id: first line of the failure}};
outcomes: pass, fail, error, skip, xfail, upass, hang, and flaky (failed,
then passed when tried again alone in a fresh process; counted as a pass,
and printed).

    cpython_suite.py --compare kernel.json ulnic.json --doc docs/sockets.md

prints both runs' counts per module side by side, and exits 1 when a test
passed over the kernel and neither passed over ulnic nor is listed in the
doc's table (rows "| `test_...` | why |").
"""

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
import unittest


def flat(suite):
    """The test cases of a suite, in order."""
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flat(t)
        else:
            yield t


class Recorder(unittest.TestResult):
    """Writes one JSON line per event, flushed, so a hang leaves its
    test's "start" last."""

    def __init__(self, log, timeout):
        super().__init__()
        self.log = log
        self.timeout = timeout

    def put(self, test, outcome, why=""):
        self.log.write(json.dumps({"id": test.id(), "outcome": outcome, "why": why}) + "\n")
        self.log.flush()

    def startTest(self, test):
        super().startTest(test)
        self.put(test, "start")
        faulthandler.dump_traceback_later(self.timeout, exit=True)

    def stopTest(self, test):
        faulthandler.cancel_dump_traceback_later()
        super().stopTest(test)

    def addSuccess(self, test):
        self.put(test, "pass")

    def addFailure(self, test, err):
        self.put(test, "fail", self.first_line(err))

    def addError(self, test, err):
        # Class and module fixtures report as a pseudo-test.
        self.put(test, "error", self.first_line(err))

    def addSkip(self, test, reason):
        self.put(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        self.put(test, "xfail")

    def addUnexpectedSuccess(self, test):
        self.put(test, "upass")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.put(test, kind, self.first_line(err))

    @staticmethod
    def first_line(err):
        return f"{err[0].__name__}: {str(err[1]).splitlines()[0] if str(err[1]) else ''}"[:200]


def child(args):
    """Runs the named modules' tests not in --done, logging to --log."""
    done = set()
    if args.done and os.path.exists(args.done):
        with open(args.done) as f:
            done = set(json.load(f))
    loader = unittest.TestLoader()
    cases = []
    for name in args.modules:
        cases += [t for t in flat(loader.loadTestsFromName(name)) if t.id() not in done]
    with open(args.log, "a") as log:
        result = Recorder(log, args.timeout)
        unittest.TestSuite(cases).run(result)
        log.write(json.dumps({"id": "", "outcome": "end"}) + "\n")


def driver(args):
    """Runs the child until every test has an outcome."""
    log = args.out + ".log"
    done_file = args.out + ".done"
    for f in (log, done_file):
        if os.path.exists(f):
            os.remove(f)
    outcomes, why = {}, {}
    t0 = time.monotonic()
    while True:
        with open(done_file, "w") as f:
            json.dump(sorted(outcomes), f)
        cmd = [sys.executable, __file__, "--child", "--log", log, "--done", done_file,
               "--timeout", str(args.timeout)] + args.modules
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        last, ended = None, False
        with open(log) as f:
            for line in f:
                e = json.loads(line)
                if e["outcome"] == "end":
                    ended = True
                elif e["outcome"] == "start":
                    last = e["id"]
                else:
                    # A sub-test's failure stays a failure.
                    if outcomes.get(e["id"]) not in ("fail", "error"):
                        outcomes[e["id"]] = e["outcome"]
                        if e["why"]:
                            why[e["id"]] = e["why"]
                    if e["id"] == last:
                        last = None
        os.remove(log)
        if ended:
            break
        if last is None or last in outcomes:
            # The process died between tests: nothing to blame; stop.
            outcomes["(run)"] = "error"
            why["(run)"] = "the test process died between tests"
            break
        outcomes[last] = "hang"
        why[last] = f"no outcome within {args.timeout} s"
    # Each failure gets a second try in a fresh process, alone: one that
    # passes then is recorded as "flaky" (a timing-dependent test on a
    # slow or loaded machine), so it is told apart from a real failure.
    for t in [t for t, o in outcomes.items() if o in ("fail", "error", "hang") and t != "(run)"]:
        with open(done_file, "w") as f:
            json.dump([], f)
        cmd = [sys.executable, __file__, "--child", "--log", log, "--done", done_file,
               "--timeout", str(args.timeout), t]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        again = []
        if os.path.exists(log):
            with open(log) as f:
                again = [json.loads(line) for line in f]
            os.remove(log)
        if any(e["id"] == t and e["outcome"] == "pass" for e in again) and not any(
                e["id"] == t and e["outcome"] in ("fail", "error") for e in again):
            outcomes[t] = "flaky"
            why[t] = "passed on a second try after: " + why.get(t, "")
    os.remove(done_file)
    with open(args.out, "w") as f:
        json.dump({"tests": outcomes, "why": why, "seconds": round(time.monotonic() - t0, 1),
                   "python": sys.version.split()[0]}, f, indent=0, sort_keys=True)


# The suites guest-lib/preload/tests/cpython.rs and tools/tests/
# cpython_guest.rs run (test_ssl is left out: its socket parts test TLS,
# which the layer passes through untouched).
SUITES = [
    "test.test_socket",
    "test.test_selectors",
    "test.test_epoll",
    "test.test_poll",
    "test.test_select",
    "test.test_socketserver",
    "test.test_httplib",
    "test.test_asyncio.test_sock_lowlevel",
    "test.test_asyncio.test_streams",
    "test.test_asyncio.test_server",
    "test.test_asyncio.test_sendfile",
]

PASSED = ("pass", "xfail")
# Failed, then passed on a second try alone (printed, not a failure).
FLAKY = ("flaky",)
FAILED = ("fail", "error", "upass")


def listed(doc):
    """The test ids the doc's table lists, with why."""
    out = {}
    with open(doc) as f:
        for line in f:
            if line.startswith("| `test_"):
                name, _, rest = line[3:].partition("`")
                out["test." + name] = rest.strip(" |\n")
    return out


def compare(args):
    """Prints the counts side by side; 1 when a kernel pass is unexplained."""
    runs = []
    for path in args.compare:
        with open(path) as f:
            runs.append(json.load(f))
    kernel, ulnic = runs[0]["tests"], runs[1]["tests"]
    modules = sorted({t.rsplit(".", 2)[0] for t in kernel} | {t.rsplit(".", 2)[0] for t in ulnic})

    def counts(tests, module=None):
        mine = [o for t, o in tests.items() if module is None or t.rsplit(".", 2)[0] == module]
        n = lambda kinds: sum(o in kinds for o in mine)
        return f"{n(PASSED + FLAKY):>5} {n(FAILED):>4} {n(('skip',)):>4} {n(('hang',)):>4}"

    took = " ".join(f"{r.get('seconds', '?')} s" for r in runs)
    print(f"CPython {runs[1].get('python', '?')} socket suites: kernel TCP vs ulnic (loopback mode); took {took}")
    print(f"{'module':<40} {'kernel: pass fail skip hang':<27}   ulnic")
    for m in modules:
        print(f"{m:<40} {counts(kernel, m):<27}   {counts(ulnic, m)}")
    print(f"{'total':<40} {counts(kernel):<27}   {counts(ulnic)}")
    known = listed(args.doc) if args.doc else {}
    unexplained, now_pass = [], []
    for t, o in sorted(kernel.items()):
        u = ulnic.get(t, "missing")
        if u in FLAKY:
            print(f"flaky (failed, then passed on a second try alone): {t}: {runs[1]['why'].get(t, '')}")
        if o in PASSED and u not in PASSED + FLAKY and t not in known:
            unexplained.append(f"{t}: {u} ({runs[1]['why'].get(t, '')})")
        if t in known and u in PASSED + FLAKY:
            now_pass.append(t)
    for t in now_pass:
        print(f"listed, but passed over ulnic this run: {t}")
    for t in unexplained:
        print(f"UNEXPLAINED (passed over the kernel): {t}")
    return 1 if unexplained else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", help="test modules, e.g. test.test_socket (default: the socket suites)")
    p.add_argument("--compare", nargs=2, metavar=("KERNEL", "ULNIC"), help="two runs' results")
    p.add_argument("--doc", help="the doc whose table lists the known differences")
    p.add_argument("--out", help="where the results go (driver)")
    p.add_argument("--timeout", type=int, default=30, help="seconds a test may take")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--done", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare:
        sys.exit(compare(args))
    if not args.modules:
        args.modules = SUITES
    if args.child:
        child(args)
    elif args.out:
        driver(args)
    else:
        p.error("--out is required")


if __name__ == "__main__":
    main()
