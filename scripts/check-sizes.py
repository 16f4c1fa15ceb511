#!/usr/bin/env python3
"""Checks the sizes of gradscope's C++ sources: no file over 700 lines, no function over 100.

A reader takes in a function of a screen or two and a file of a few hundred lines; past that,
code is split along its concerns (docs/architecture.md). Lists every file under the source
root over the file limit and every function over the function limit, and exits 1 if any is
not one of the declarative exceptions below (tables whose length is their content, one row a
setting); exits 0 when everything is within the limits.

  scripts/check-sizes.py [--file-lines N] [--function-lines N] [SOURCE_ROOT]
      (default: the repository's src/gradscope, 700 and 100)

A file's length is its line count (as wc -l counts them). A function's is the lines from its
opening brace to its closing one; lambdas and local classes count as part of the function
they are in, and member functions defined in a class body count on their own. Comments,
string and character literals (raw strings included) and preprocessor lines are blanked
before braces are matched, so a brace in them counts for nothing.

Python's standard library alone: the project environment's Python runs it, or any Python 3.
"""
import argparse
import os
import re
import sys

# Declarative tables, exempt from the limits: (path under the source root, function name or
# None for the whole file, why). Keep this list short; everything else is split.
EXCEPTIONS = [
    ("core/settings_table.cpp", "build_settings_table",
     "the settings table: one row per run setting"),
    ("core/settings_table_rows.cpp", "add_step_to_output_rows",
     "the settings table's later sections: one row per run setting"),
]

IDENT = re.compile(r"[A-Za-z0-9_]")
RAW_PREFIX = re.compile(r'(?:u8|[uUL])?R"([^()\\\s"]{0,16})\(')
STRING_PREFIX = re.compile(r"(?:u8|[uUL])?$")


def blank(text):
    """Spaces for every character of `text` but its line breaks."""
    return re.sub(r"[^\n]", " ", text)


def strip_code(text):
    """The source with comments, literals and preprocessor lines blanked, lines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True  # only blanks since the last line break
    while i < n:
        c = text[i]
        if line_start and c == "#":
            # A preprocessor directive, with its continuation lines.
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] == "\\" or (text[k - 1] == "\r" and text[k - 2] == "\\"):
                    j = k + 1
                    continue
                break
            out.append(blank(text[i:k]))
            i = k
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
            continue
        raw = RAW_PREFIX.match(text, i)
        if raw and (i == 0 or not IDENT.match(text[i - 1])):
            end = ")" + raw.group(1) + '"'
            j = text.find(end, raw.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
            continue
        if c == "'" and is_digit_separator(text, i):
            out.append(c)
            i += 1
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j, n - 1)
            out.append(c + blank(text[i + 1:j]) + text[j])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def is_digit_separator(text, i):
    """Whether the quote at i separates digits (1'000'000), not a character literal."""
    j = i
    while j > 0 and (IDENT.match(text[j - 1]) or text[j - 1] in ".'"):
        j -= 1
    return j < i and text[j].isdigit()


def collapse_groups(head):
    """`head` with each nested {...} group reduced to {}, for matching its shape."""
    out, depth = [], 0
    for c in head:
        if c == "{":
            if depth == 0:
                out.append("{")
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                out.append("}")
        elif depth == 0:
            out.append(c)
    return "".join(out)


TRAILING_QUALIFIERS = re.compile(
    r"(?:\b(?:const|volatile|override|final|mutable|noexcept|try)|&&|&"
    r"|\b(?:noexcept|throw)\s*\([^()]*\))\s*$")
ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:(?!:)")
SCOPE = re.compile(r"^\s*(?:(?:inline\s+)?namespace\b[\w:\s]*|extern\s*\"\s*\")\s*$")
TYPE_BODY = re.compile(r"\b(?:class|struct|union|enum)\b[^()=;]*$")
CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof"}


def paren_depths(text):
    """The parenthesis depth before each character of `text`."""
    depths, depth = [], 0
    for c in text:
        if c == ")":
            depth -= 1
        depths.append(depth)
        if c == "(":
            depth += 1
    return depths


def without_templates(text):
    """`text` without its template parameter lists (template <typename T = int>)."""
    while True:
        m = re.search(r"\btemplate\s*<", text)
        if not m:
            return text
        depth, k = 0, m.end() - 1
        for k in range(m.end() - 1, len(text)):
            depth += {"<": 1, ">": -1}.get(text[k], 0)
            if depth == 0:
                break
        text = text[:m.start()] + text[k + 1:]


def function_name(head):
    """The name of the function whose definition `head` (the text before its body's `{`)
    begins, or None when the brace opens no function body."""
    head = collapse_groups(head)
    while ACCESS.match(head):
        head = ACCESS.sub("", head, count=1)
    if SCOPE.match(head) or TYPE_BODY.search(head):
        return None
    depths = paren_depths(head)
    # A constructor's initializer list: the signature ends at the first top-level ':' (not
    # '::') after a ')'.
    seen_paren = False
    for k, c in enumerate(head):
        if depths[k] != 0:
            continue
        if c == ")":
            seen_paren = True
        elif (c == ":" and seen_paren and head[k - 1] != ":"
              and (k + 1 >= len(head) or head[k + 1] != ":")):
            # The body follows a whole initializer (a_(x) or a_{x}); a brace right after a
            # member's name is that member's initializer.
            if not head[k + 1:].rstrip().endswith((")", "}")):
                return None
            head = head[:k]
            depths = depths[:k]
            break
    # A trailing return type: from the first top-level '->' after the parameters.
    for k in range(len(head) - 1):
        if depths[k] == 0 and head.startswith("->", k) and ")" in head[:k]:
            head = head[:k]
            break
    sig = head.rstrip()
    while True:
        stripped = TRAILING_QUALIFIERS.sub("", sig).rstrip()
        if stripped == sig:
            break
        sig = stripped
    if not sig.endswith(")"):
        return None
    # The parameter list's '(' and the name before it.
    depth = 0
    for k in range(len(sig) - 1, -1, -1):
        if sig[k] == ")":
            depth += 1
        elif sig[k] == "(":
            depth -= 1
            if depth == 0:
                break
    else:
        return None
    before = sig[:k].rstrip()
    operators = re.compile(r"operator\s*(?:\(\s*\)|\[\s*\]|[^\w\s(]+)")
    plain = operators.sub("operator", without_templates(before))
    if plain.endswith("]") or "=" in plain:
        return None  # a lambda, or a variable's initializer
    name = re.search(r"((?:[\w~]+(?:<[^()]*>)?::)*(?:operator\s*(?:\(\s*\)|\[\s*\]|[^\w\s(]+)"
                     r"|operator\s+\w+|~?\w+))\s*(?:<[^()]*>)?$", before)
    if not name:
        return None
    if name.group(1).split("::")[-1] in CONTROL:
        return None
    return name.group(1)


def long_functions(text, limit):
    """(line of its name, lines, name) of each function body in `text` longer than `limit`."""
    code = strip_code(text)
    found = []
    stack = []  # (kind, line of '{', name, resets statement, line of the name)
    statement_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == ";":
            if not any(kind == "function" for kind, *_ in stack):
                statement_start = i + 1
        elif c == "{":
            if any(kind == "function" for kind, *_ in stack):
                stack.append(("other", line, None, False, line))
                continue
            head = code[statement_start:i]
            name = function_name(head)
            if name:
                at = code.rfind(name.split("::")[-1], statement_start, i)
                name_line = line - code.count("\n", at, i) if at >= 0 else line
                stack.append(("function", line, name, True, name_line))
            elif SCOPE.match(collapse_groups(head)) or TYPE_BODY.search(collapse_groups(head)):
                stack.append(("scope", line, None, True, line))
                statement_start = i + 1
            else:
                stack.append(("other", line, None, False, line))  # an initializer's braces
        elif c == "}":
            if not stack:
                continue
            kind, start, name, resets, name_line = stack.pop()
            if kind == "function" and line - start + 1 > limit:
                found.append((name_line, line - start + 1, name))
            if resets and not any(k == "function" for k, *_ in stack):
                statement_start = i + 1
    return found


def line_count(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def exception_for(rel, name):
    for path, function, why in EXCEPTIONS:
        if path == rel and function == name:
            return why
    return None


def check(root, file_limit, function_limit, out=sys.stdout):
    """Prints what is over the limits under `root`; returns the number not exempt."""
    over, used = 0, set()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if not f.endswith((".cpp", ".h", ".hpp", ".cc")):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8", errors="replace") as source:
                text = source.read()
            lines = line_count(text)
            if lines > file_limit:
                why = exception_for(rel, None)
                if why:
                    used.add((rel, None))
                    print(f"{rel}: {lines} lines (allowed: {why})", file=out)
                else:
                    over += 1
                    print(f"{rel}: {lines} lines, over {file_limit}", file=out)
            for start, length, name in long_functions(text, function_limit):
                short = name.split("::")[-1]
                why = exception_for(rel, short) or exception_for(rel, name)
                if why:
                    used.add((rel, short))
                    print(f"{rel}:{start}: {name}: {length} lines (allowed: {why})", file=out)
                else:
                    over += 1
                    print(f"{rel}:{start}: {name}: {length} lines, over {function_limit}",
                          file=out)
    for path, function, _ in EXCEPTIONS:
        if os.path.exists(os.path.join(root, path)) and (path, function) not in used:
            print(f"check-sizes: the exception for {path}"
                  f"{' ' + function if function else ''} is no longer needed: remove it",
                  file=out)
    return over


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(repo, "src", "gradscope"))
    parser.add_argument("--file-lines", type=int, default=700)
    parser.add_argument("--function-lines", type=int, default=100)
    args = parser.parse_args()
    if not os.path.isdir(args.root):
        print(f"check-sizes: no folder {args.root}", file=sys.stderr)
        return 2
    over = check(args.root, args.file_lines, args.function_lines)
    if over:
        print(f"check-sizes: {over} over the limits ({args.file_lines} lines a file, "
              f"{args.function_lines} a function): split them along their concerns",
              file=sys.stderr)
        return 1
    print(f"check-sizes: every file within {args.file_lines} lines and every function within "
          f"{args.function_lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
