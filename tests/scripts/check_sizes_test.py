#!/usr/bin/env python3
"""Tests of scripts/check-sizes.py: it finds a long function and a long file, and nothing in
code whose braces hide in strings, comments and initializers.

  python3 tests/scripts/check_sizes_test.py    (CTest runs it as SizeCheckSelfTest)
"""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "check-sizes.py")


def body(lines):
    """`lines` statements, one a line."""
    return "".join(f"  x += {i};\n" for i in range(lines))


class CheckSizesTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.root = self.folder.name

    def tearDown(self):
        self.folder.cleanup()

    def write(self, path, text):
        full = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)

    def run_check(self, *flags):
        r = subprocess.run([sys.executable, SCRIPT, *flags, self.root], capture_output=True,
                           text=True)
        return r.returncode, r.stdout + r.stderr

    def test_within_the_limits_passes(self):
        self.write("core/small.cpp", "int f(int x) {\n" + body(90) + "  return x;\n}\n")
        code, out = self.run_check()
        self.assertEqual(code, 0, out)
        self.assertIn("every file within 700 lines", out)

    def test_long_function_is_named_with_its_line(self):
        self.write("core/long.cpp",
                   "// A file.\n#include <x>\n\nint short_one() { return 1; }\n\n"
                   "int long_one(int x) {\n" + body(120) + "  return x;\n}\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/long.cpp:6: long_one: 123 lines, over 100", out)
        self.assertNotIn("short_one", out)

    def test_long_file_is_named(self):
        functions = "".join(f"int f{i}(int x) {{\n{body(5)}  return x;\n}}\n" for i in range(110))
        self.write("data/big.cpp", functions)
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("data/big.cpp: 880 lines, over 700", out)
        self.assertNotIn("f1:", out)

    def test_limits_can_be_set(self):
        self.write("core/mid.cpp", "int mid(int x) {\n" + body(30) + "  return x;\n}\n")
        code, out = self.run_check("--function-lines", "20", "--file-lines", "10")
        self.assertEqual(code, 1, out)
        self.assertIn("core/mid.cpp:1: mid: 33 lines, over 20", out)
        self.assertIn("core/mid.cpp: 33 lines, over 10", out)

    def test_braces_in_strings_comments_and_literals_count_for_nothing(self):
        # Each hides an unbalanced brace; counted, they would end long_one early or late.
        tricky = (
            "int long_one(int x) {\n"
            "  const char* s = \"}}} \\\" }\";\n"
            "  const char* raw = R\"SQL(\n  CREATE TABLE t(a) } } }\n  )SQL\";\n"
            "  const char* raw2 = u8R\"(})\";\n"
            "  char c = '}';\n  char q = '\\'';\n  char b = '{';\n"
            "  long n = 1'000'000;  // }\n"
            "  /* } } }\n  } */\n"
            "#define CLOSE }\n"
            + body(100) + "  return x;\n}\n"
            "int after() { return 0; }\n")
        self.write("core/tricky.cpp", tricky)
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/tricky.cpp:1: long_one: 115 lines, over 100", out)
        self.assertNotIn("after", out)

    def test_lambdas_count_in_their_function(self):
        lambdas = (
            "void outer() {\n"
            "  auto f = [&](int a) {\n" + body(60) + "  };\n"
            "  std::sort(v.begin(), v.end(), [](int a, int b) {\n" + body(50) + "  });\n"
            "}\n")
        self.write("core/lambdas.cpp", lambdas)
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/lambdas.cpp:1: outer: 116 lines, over 100", out)
        self.assertEqual(out.count("over 100"), 1, out)

    def test_namespace_lambda_and_tables_are_no_functions(self):
        table = (
            "namespace gradscope {\nnamespace {\n"
            "const std::vector<int> kTable = {\n" + "  1,\n" * 150 + "};\n"
            "const auto kMade = [] {\n" + body(120) + "  return 1;\n}();\n"
            "enum class Kind {\n" + "  kA,\n" * 120 + "};\n"
            "}  // namespace\n}  // namespace gradscope\n")
        self.write("core/tables.cpp", table)
        code, out = self.run_check()
        self.assertEqual(code, 0, out)

    def test_constructors_members_and_operators(self):
        code_text = (
            "namespace gradscope {\n"
            "class Big : public Base {\n"
            " public:\n"
            "  Big(int a, int b) : a_{a}, b_(b), v_{1, 2, 3} {\n" + body(105) + "  }\n"
            "  bool operator()(int x) const {\n" + body(101) + "    return true;\n  }\n"
            "  int small() const noexcept { return a_; }\n"
            " private:\n  int a_{0};\n  int b_ = 1;\n  std::vector<int> v_;\n"
            "};\n"
            "Big::Big(const Big& o)\n    : a_(o.a_),\n      b_{o.b_} {\n" + body(102) + "}\n"
            "template <typename T = int>\nauto tail(T t) -> decltype(t + 1) {\n"
            + body(101) + "  return t;\n}\n"
            "}  // namespace gradscope\n")
        self.write("core/members.cpp", code_text)
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/members.cpp:4: Big: 107 lines, over 100", out)
        self.assertIn(": operator(): 104 lines, over 100", out)
        self.assertIn(": Big::Big: 104 lines, over 100", out)
        self.assertIn(": tail: 104 lines, over 100", out)
        self.assertNotIn("small", out)
        self.assertEqual(out.count("over 100"), 4, out)

    def test_control_blocks_at_function_scope_are_no_functions(self):
        self.write("core/control.cpp",
                   "int f(int x) {\n  if (x) {\n" + body(30) + "  }\n"
                   "  for (int i = 0; i < 3; ++i) {\n" + body(30) + "  }\n"
                   "  switch (x) {\n    case 1: {\n" + body(10) + "    }\n  }\n"
                   "  return x;\n}\n")
        code, out = self.run_check()
        self.assertEqual(code, 0, out)

    def test_the_repository_exceptions_are_named(self):
        # The declarative exceptions are listed as allowed, and change nothing else.
        self.write("core/settings_table.cpp",
                   "std::vector<Setting> build_settings_table() {\n" + body(650) + "}\n")
        code, out = self.run_check()
        self.assertEqual(code, 0, out)
        self.assertIn("build_settings_table: 652 lines (allowed", out)
        # The function is exempt, its file is not: over 700 lines it is split like any other.
        self.write("core/settings_table.cpp",
                   "std::vector<Setting> build_settings_table() {\n" + body(750) + "}\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/settings_table.cpp: 752 lines, over 700", out)
        self.write("core/settings_table.cpp",
                   "std::vector<Setting> build_settings_table() {\n" + body(650) + "}\n")
        self.write("core/other_table.cpp",
                   "std::vector<Setting> build_settings_table() {\n" + body(150) + "}\n")
        code, out = self.run_check()
        self.assertEqual(code, 1, out)
        self.assertIn("core/other_table.cpp:1: build_settings_table: 152 lines, over 100", out)

    def test_missing_folder_is_an_error(self):
        r = subprocess.run([sys.executable, SCRIPT, os.path.join(self.root, "absent")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)


if __name__ == "__main__":
    unittest.main()
