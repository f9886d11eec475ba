#!/usr/bin/env python3
"""The structure rules of the code, checked by a machine (make test runs it as structure_check).

Rules, for product sources (*.cc and *.h under common/, server/, worker/ and client/):
  files      no file over 700 lines;
  functions  no function over 120 lines, as Universal Ctags measures it (its start and end lines
             of every function definition, class members included);
  clock      no read of the wall clock and no wait but through common/clock.h: absl::Now(),
             absl::SleepFor, any X::now() (std::chrono's clocks, aliases of them included),
             std::this_thread::sleep_for, sleep(),
             usleep() and nanosleep() appear only in common/clock.h;
  docs       a document a file cites (docs/x.md, README.md, ...) exists in the repository;
  rooms      a file of a room of the coordinator (server/ROOM/) or of the shared code
             (common/ROOM/) includes only headers of its own room and of the rooms below it
             (ROOMS, COMMON_ROOMS; a file at common/ itself, none), so arrows point down, with no
             cycles;
and for every C++ file of the repository (tests and benchmarks too):
  format     formatted as .clang-format says (clang-format --dry-run -Werror).

An exception is a line of scripts/structure_exceptions.txt: the rule, the file (and for
functions the function's name), and after a '#' why. An exception that no longer matches
anything is itself an error, so the list only shrinks.

Exit status 0 when every rule holds; 1 with one line per problem: the file, the line, the rule
and how to comply.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
PRODUCT_DIRS = ("common", "server", "worker", "client")
CLOCK_HOME = "common/clock.h"
CLOCK_CALLS = re.compile(
    r"absl::Now\(\)|absl::SleepFor\(|\b\w+::now\(\)|sleep_for\(|"
    r"(?<![\w:.>])(?:::)?(?:sleep|usleep|nanosleep)\(")
DOC_CITE = re.compile(r"\b((?:docs/)?[A-Za-z0-9_.-]+\.md)\b")
EXCEPTIONS = "scripts/structure_exceptions.txt"
# The coordinator's rooms and those each may call (docs/architecture.md, "The coordinator's
# rooms"); server/main.cc assembles them all.
ROOMS = {
    "lifecycle": set(),
    "store": {"lifecycle"},
    "leadership": {"store", "lifecycle"},
    "auth": {"store"},
    "scheduling": set(),
    "jobs": {"store", "scheduling", "auth", "lifecycle"},
    "searches": {"jobs", "auth", "store"},
    "api": {"jobs", "searches", "auth"},
    "capacity": {"jobs"},
    "console": set(),
}
# The shared code's rooms (docs/architecture.md, "Shared code"); the files at common/ itself (the
# clock, logging, sizes, hashes) are below them all and call none.
COMMON_ROOMS = {
    "storage": set(),
    "spec": {"storage"},
    "formats": {"storage"},
    "rpc": set(),
}
# Each top folder with rooms: its rooms, and how an include of one of them reads.
ROOMED = {
    "server": (ROOMS, re.compile(r'#include "server/([^/"]+)/[^"]+"')),
    "common": (COMMON_ROOMS, re.compile(r'#include "common/([^/"]+)/[^"]+"')),
}


def git_files(root):
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True, text=True).stdout
    return sorted(f for f in out.splitlines() if os.path.isfile(os.path.join(root, f)))


def is_cpp(path):
    return path.endswith((".cc", ".h"))


def is_product(path):
    return is_cpp(path) and path.split("/", 1)[0] in PRODUCT_DIRS


def strip_comments_and_strings(line):
    """The code of a line without its // comment and string literals (good enough for calls)."""
    line = re.sub(r'"(?:\\.|[^"\\])*"', '""', line)
    return line.split("//", 1)[0]


def load_exceptions(root):
    """{(rule, file, name or ""): reason} from the exceptions file; errors for bad lines."""
    allowed, errors = {}, []
    path = os.path.join(root, EXCEPTIONS)
    if not os.path.exists(path):
        return allowed, errors
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.split()
            if parts[0] not in ("files", "functions", "clock", "docs", "rooms", "format") or \
                    len(parts) not in (2, 3) or "#" not in raw:
                errors.append("%s:%d: exceptions: expected 'RULE FILE [FUNCTION]  # why', got %r"
                              % (EXCEPTIONS, number, raw.strip()))
                continue
            allowed[(parts[0], parts[1], parts[2] if len(parts) == 3 else "")] = number
    return allowed, errors


class Checker:
    def __init__(self, root, allowed):
        self.root = root
        self.allowed = allowed
        self.used = set()
        self.problems = []

    def report(self, rule, path, line, name, message):
        key = (rule, path, name)
        if key in self.allowed:
            self.used.add(key)
            return
        self.problems.append("%s:%d: %s: %s" % (path, line, rule, message))

    def read(self, path):
        with open(os.path.join(self.root, path), encoding="utf-8", errors="replace") as f:
            return f.read().split("\n")

    def check_file_lengths(self, files):
        for path in files:
            lines = self.read(path)
            count = len(lines) - (1 if lines and lines[-1] == "" else 0)
            if count > MAX_FILE_LINES:
                self.report("files", path, count, "",
                            "%d lines, over %d: split it by what its parts do"
                            % (count, MAX_FILE_LINES))

    def check_function_lengths(self, files):
        if not files:
            return
        out = subprocess.run(
            ["ctags", "--output-format=json", "--fields=+ne", "--languages=C++",
             "--language-force=C++", "--kinds-C++=f", "-f", "-"] + files,
            cwd=self.root, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            tag = json.loads(line)
            # A lambda counts toward the function that holds it, not as one of its own.
            if tag.get("_type") != "tag" or "end" not in tag or tag["name"].startswith("__anon"):
                continue
            length = tag["end"] - tag["line"] + 1
            if length > MAX_FUNCTION_LINES:
                self.report("functions", tag["path"], tag["line"], tag["name"],
                            "%s is %d lines, over %d: name its parts and call them"
                            % (tag["name"], length, MAX_FUNCTION_LINES))

    def check_clock(self, files):
        for path in files:
            if path == CLOCK_HOME:
                continue
            for number, line in enumerate(self.read(path), 1):
                match = CLOCK_CALLS.search(strip_comments_and_strings(line))
                if match:
                    self.report("clock", path, number, "",
                                "%s outside %s: take a Clock& (Now, SleepFor) instead"
                                % (match.group(0), CLOCK_HOME))

    def check_docs(self, files, all_files):
        known = set(all_files)
        for path in files:
            for number, line in enumerate(self.read(path), 1):
                for cited in DOC_CITE.findall(line):
                    candidates = {cited, "docs/" + cited}
                    if not candidates & known:
                        self.report("docs", path, number, "",
                                    "cites %s, which is not in the repository: cite what exists"
                                    % cited)

    def check_rooms(self, files):
        for path in files:
            parts = path.split("/")
            if parts[0] not in ROOMED:
                continue
            rooms, include = ROOMED[parts[0]]
            # A file at the top of a roomed folder of common/ is below every room: it calls none.
            room = parts[1] if len(parts) == 3 else None
            if len(parts) == 2 and parts[0] == "server":
                continue  # server/main.cc and the flags assemble every room
            if len(parts) > 3 or (room is not None and room not in rooms):
                self.report("rooms", path, 1, "",
                            "%s/ is no room of scripts/check_structure.py's rooms of %s/: add it "
                            "there and to docs/architecture.md" % ("/".join(parts[:-1]), parts[0]))
                continue
            allowed = rooms[room] if room is not None else set()
            for number, line in enumerate(self.read(path), 1):
                match = include.match(line)
                if match and match.group(1) != room and match.group(1) not in allowed:
                    self.report("rooms", path, number, "",
                                "%s may not call %s/%s/ (arrows point down): move the code or "
                                "the rule" % ("/".join(parts[:-1]) + "/", parts[0],
                                             match.group(1)))

    def check_format(self, files):
        if not files:
            return
        result = subprocess.run(["clang-format", "--dry-run", "-Werror"] + files, cwd=self.root,
                                capture_output=True, text=True)
        unformatted = sorted(set(re.findall(r"^([^\s:]+\.(?:cc|h)):\d+:\d+: error",
                                            result.stderr, re.M)))
        for path in unformatted:
            self.report("format", path, 1, "",
                        "not formatted as .clang-format says: run clang-format -i %s" % path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    for tool in ("ctags", "clang-format", "git"):
        if shutil.which(tool) is None:
            print("structure check: %s is not installed (scripts/install-deps.sh installs it)"
                  % tool)
            return 1
    version = subprocess.run(["ctags", "--version"], capture_output=True, text=True).stdout
    if "Universal Ctags" not in version:
        print("structure check: ctags is not Universal Ctags (it measures no function ends)")
        return 1
    all_files = git_files(root)
    product = [f for f in all_files if is_product(f)]
    cpp = [f for f in all_files if is_cpp(f) and not f.startswith("third_party/")]
    allowed, errors = load_exceptions(root)
    checker = Checker(root, allowed)
    checker.check_file_lengths(product)
    checker.check_function_lengths(product)
    checker.check_clock(product)
    checker.check_docs(product, all_files)
    checker.check_rooms(product)
    checker.check_format(cpp)
    problems = errors + checker.problems
    for key, number in sorted(allowed.items(), key=lambda item: item[1]):
        if key not in checker.used:
            problems.append("%s:%d: exceptions: '%s' no longer matches anything: remove the line"
                            % (EXCEPTIONS, number, " ".join(k for k in key if k)))
    for problem in problems:
        print(problem)
    print("structure check: %d files, %d problems" % (len(cpp), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
