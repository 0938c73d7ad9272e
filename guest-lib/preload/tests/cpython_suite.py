#!/usr/bin/env python3
"""Runs CPython's own socket test suites (Debian libpython3.11-testsuite)
and records each test's outcome, for guest-lib/preload/tests/cpython.rs,
which runs it over the kernel and under the preload layer.

A test that hangs is stopped (faulthandler ends the process after
--timeout seconds), recorded as "hang", and the run goes on in a new
process without the tests already done.

    cpython_suite.py --out results.json test.test_socket test.test_select

writes {"tests": {id: outcome}, "why": {id: first line of the failure}};
outcomes: pass, fail, error, skip, xfail, upass, hang.
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
    os.remove(done_file)
    with open(args.out, "w") as f:
        json.dump({"tests": outcomes, "why": why, "seconds": round(time.monotonic() - t0, 1)}, f,
                  indent=0, sort_keys=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="+", help="test modules, e.g. test.test_socket")
    p.add_argument("--out", help="where the results go (driver)")
    p.add_argument("--timeout", type=int, default=30, help="seconds a test may take")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--done", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
    elif args.out:
        driver(args)
    else:
        p.error("--out is required")


if __name__ == "__main__":
    main()
