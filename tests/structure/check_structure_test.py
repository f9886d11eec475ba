#!/usr/bin/env python3
"""scripts/check_structure.py against small repositories made here: each rule finds what breaks
it (file, line, rule), an exception silences exactly its own case, a stale exception is an error,
and a tree that keeps every rule passes."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "..", "..", "scripts", "check_structure.py")
CLANG_FORMAT = os.path.join(HERE, "..", "..", ".clang-format")


def function(name, lines):
    body = "".join("  x += %d;\n" % i for i in range(lines - 4))
    return "int %s() {\n  int x = 0;\n%s  return x;\n}\n" % (name, body)


class CheckStructureTest(unittest.TestCase):
    def repo(self, files):
        root = tempfile.mkdtemp(prefix="check_structure_test.")
        with open(CLANG_FORMAT) as src, open(os.path.join(root, ".clang-format"), "w") as dst:
            dst.write(src.read())
        for path, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", root], check=True)
        return root

    def check(self, root):
        result = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True,
                                text=True)
        return result.returncode, result.stdout

    def test_a_tree_that_keeps_the_rules_passes(self):
        root = self.repo({"common/clock.h": "// absl::Now() lives here.\n",
                          "docs/guide.md": "# Guide\n",
                          "server/a.cc": "// See docs/guide.md.\n" + function("Short", 20)})
        code, out = self.check(root)
        self.assertEqual(code, 0, out)
        self.assertIn("0 problems", out)

    def test_each_rule_names_the_file_the_line_and_the_rule(self):
        root = self.repo({
            "server/long.cc": "".join("int v%d = %d;\n" % (i, i) for i in range(701)),
            "worker/f.cc": "\n" + function("TooLong", 121) + function("Fine", 120),
            "client/t.cc": "#include \"common/clock.h\"\nvoid F() {\n  auto t = absl::Now();\n"
                           "  usleep(3);  // absl::Now() in a comment is fine\n"
                           "  auto s = Steady::now();\n}\n",
            "common/d.h": "// As docs/missing.md says.\n",
            "tests/ugly_test.cc": "int  main( ) { return 0 ; }\n",
        })
        code, out = self.check(root)
        self.assertEqual(code, 1, out)
        self.assertIn("server/long.cc:701: files: 701 lines, over 700", out)
        self.assertIn("worker/f.cc:2: functions: TooLong is 121 lines, over 120", out)
        self.assertNotIn("Fine is", out)
        self.assertIn("client/t.cc:3: clock: absl::Now() outside common/clock.h", out)
        self.assertIn("client/t.cc:4: clock: usleep(", out)
        self.assertIn("client/t.cc:5: clock: Steady::now()", out)
        self.assertIn("common/d.h:1: docs: cites docs/missing.md", out)
        self.assertIn("tests/ugly_test.cc:1: format: not formatted", out)
        self.assertIn("7 problems", out)

    def test_exceptions_silence_their_own_case_and_must_stay_true(self):
        root = self.repo({
            "worker/f.cc": function("TooLong", 130),
            "scripts/structure_exceptions.txt":
                "functions worker/f.cc TooLong  # being split\n"
                "files worker/gone.cc  # was long\n"
                "functions worker/f.cc  # no reason given is fine, but not no name\n",
        })
        code, out = self.check(root)
        self.assertEqual(code, 1, out)
        self.assertNotIn("TooLong is", out)
        self.assertIn("'files worker/gone.cc' no longer matches anything", out)
        self.assertIn("'functions worker/f.cc' no longer matches anything", out)

    def test_rooms_call_only_the_rooms_below_them(self):
        root = self.repo({
            "server/store/s.cc": "#include \"server/jobs/job_manager.h\"\n"
                                 "#include \"server/lifecycle/job_state.h\"\n",
            "server/api/a.cc": "#include \"server/jobs/job_manager.h\"\n",
            "server/misc/m.cc": "int m = 0;\n",
        })
        code, out = self.check(root)
        self.assertEqual(code, 1, out)
        self.assertIn("server/store/s.cc:1: rooms: server/store/ may not call server/jobs/", out)
        self.assertNotIn("server/store/s.cc:2", out)
        self.assertNotIn("server/api/a.cc", out)
        self.assertIn("server/misc/m.cc:1: rooms: server/misc/ is no room", out)
        self.assertIn("2 problems", out)

    def test_shared_code_keeps_its_rooms_above_its_base(self):
        root = self.repo({
            "common/storage/u.cc": "#include \"common/spec/job_spec.h\"\n",
            "common/storage/v.cc": "#include \"common/log.h\"\n",
            "common/spec/j.cc": "#include \"common/storage/uri.h\"\n",
            "common/log.cc": "#include \"common/rpc/channel.h\"\n",
            "common/odd/x.cc": "int x = 0;\n",
        })
        code, out = self.check(root)
        self.assertEqual(code, 1, out)
        self.assertIn("common/storage/u.cc:1: rooms: common/storage/ may not call common/spec/", out)
        self.assertNotIn("common/storage/v.cc", out)
        self.assertNotIn("common/spec/j.cc", out)
        self.assertIn("common/log.cc:1: rooms: common/ may not call common/rpc/", out)
        self.assertIn("common/odd/x.cc:1: rooms: common/odd/ is no room", out)
        self.assertIn("3 problems", out)


if __name__ == "__main__":
    unittest.main()
