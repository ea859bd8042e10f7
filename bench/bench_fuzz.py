"""The long fuzz run (issue 15): each fuzzer of tests/test_fuzz.py for minutes, not examples.

Fuzzers, as the issue names them (each gets ``--minutes``, its parts taking turns):

* ``wire``: horusd's wire protocol (line decoding; ``decide`` on any message from either socket; any
  byte stream on the user socket, with the front still answering and no traceback logged);
* ``sbatch``: the ``#SBATCH`` parser and horus-sbatch's plan on any script and argv;
* ``traces``: the trace readers, every format, on any file;
* ``csv``: the profiles/observations CSV loaders.

A "traceback" is any exception other than the one-line error a path is allowed (InputError, a
ValueError from decoding) or a traceback in horusd's log. Prints JSON: per fuzzer the seconds,
examples tried and distinct tracebacks found (with the first falsifying example of each).
Usage: ``.venv/bin/python bench/bench_fuzz.py [--minutes 10] [--only wire,csv]``. No outside data.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
os.environ["HORUS_FUZZ_EXAMPLES"] = "200"  # per round; rounds repeat until the time is up

import test_fuzz  # noqa: E402

GROUPS = {
    "wire": ["wire-decode", "wire-decide", "wire-front"],
    "sbatch": ["sbatch-script"],
    "traces": ["trace-readers"],
    "csv": ["csv-loaders"],
}


def run_group(parts, seconds):
    found, started, turn = {}, time.monotonic(), 0
    while time.monotonic() - started < seconds:
        name = parts[turn % len(parts)]
        turn += 1
        try:
            test_fuzz.TARGETS[name]()
        except Exception as exc:  # a falsifying example: hypothesis has shrunk it
            key = f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            if key not in found:
                notes = "\n".join(getattr(exc, "__notes__", []))[:1500]
                found[key] = notes
                print(f"traceback found by {name}: {key}\n{notes}", file=sys.stderr, flush=True)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "examples": {name: test_fuzz.COUNTS[name] for name in parts},
        "tracebacks": len(found),
        "found": found,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="per fuzzer")
    parser.add_argument("--only", default=",".join(GROUPS), help="comma-separated fuzzers")
    args = parser.parse_args()
    results = {}
    for group in args.only.split(","):
        results[group] = run_group(GROUPS[group], args.minutes * 60)
        print(f"{group}: {results[group]['examples']} examples, {results[group]['tracebacks']} tracebacks",
              file=sys.stderr, flush=True)
    print(json.dumps({"benchmark": "fuzz", "minutes_each": args.minutes, "fuzzers": results,
                      "tracebacks": sum(r["tracebacks"] for r in results.values())}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
