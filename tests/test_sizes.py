"""Files and functions a reader can hold: no product .py file over 400 lines, no Python function or
method over 60 lines, no dashboard JS function over 60 lines (migrations excepted).

A function's length is its whole span, nested functions included, from `def` (JS: its name, or
`=>`) to its last line. The JS scanner below is a small tokenizer, not a parser: it knows strings,
template literals (with `${}` nesting), comments and regex literals well enough that braces inside
them are not counted, and it takes a `{` as a function body when it follows `=>`, or follows
`name(...)` where name is not a control keyword (`if`, `for`, ...): declarations, methods, getters.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON_PACKAGES = ("core", "trainer", "api", "worker", "client", "cli", "bench")
JS_FOLDER = ROOT / "api" / "static" / "js"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


@dataclass(frozen=True)
class Span:
    name: str
    line: int  # 1-based line where it starts
    lines: int


def python_files() -> list[Path]:
    return sorted(p for package in PYTHON_PACKAGES for p in (ROOT / package).rglob("*.py"))


def python_functions(source: str) -> Iterator[Span]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            yield Span(node.name, node.lineno, end - node.lineno + 1)


# ---- JS ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    text: str  # an identifier, a number, one punctuation character, "=>", or "literal"
    line: int


# After one of these a `/` starts a regex literal; after anything else (a name, a number, `)`, `]`) it
# divides. `}` is taken as the end of a block, which is what it is where this project writes a regex.
_REGEX_AFTER_PUNCTUATION = set("(,=:[!&|?{};+-*%<>~^")
_REGEX_AFTER_WORDS = {"return", "typeof", "case", "do", "else", "in", "of", "new", "delete", "void", "throw"}
_NOT_FUNCTIONS = {"if", "for", "while", "switch", "catch", "with", "await", "return", "typeof"}
_WORD = re.compile(r"[A-Za-z_$][\w$]*|\d[\w.]*")


class _JsTokenizer:
    def __init__(self, source: str) -> None:
        self.src, self.i, self.line = source, 0, 1
        self.tokens: list[Token] = []
        self.braces: list[str] = []  # "{" for a code brace, "${" for a template substitution

    def run(self) -> list[Token]:
        while self.i < len(self.src):
            self._step()
        return self.tokens

    def _advance_to(self, end: int) -> None:
        self.line += self.src.count("\n", self.i, end)
        self.i = end

    def _step(self) -> None:
        src, i = self.src, self.i
        c, pair = src[i], src[i : i + 2]
        if c.isspace():
            self._advance_to(i + 1)
        elif pair == "//":
            end = src.find("\n", i)
            self._advance_to(len(src) if end < 0 else end)
        elif pair == "/*":
            self._advance_to(src.index("*/", i + 2) + 2)
        elif c in "'\"":
            self._literal(self._quoted(i, c))
        elif c == "`" or (c == "}" and self.braces and self.braces[-1] == "${"):
            if c == "}":
                self.braces.pop()
            self._template(i + 1)
        elif c == "/" and self._regex_allowed():
            self._literal(self._regex_end(i))
        elif pair == "=>":
            self.tokens.append(Token("=>", self.line))
            self._advance_to(i + 2)
        elif match := _WORD.match(src, i):
            self.tokens.append(Token(match.group(), self.line))
            self._advance_to(match.end())
        else:
            if c == "{":
                self.braces.append("{")
            elif c == "}" and self.braces:
                self.braces.pop()
            self.tokens.append(Token(c, self.line))
            self._advance_to(i + 1)

    def _literal(self, end: int) -> None:
        self.tokens.append(Token("literal", self.line))
        self._advance_to(end)

    def _quoted(self, start: int, quote: str) -> int:
        i = start + 1
        while self.src[i] != quote:
            i += 2 if self.src[i] == "\\" else 1
        return i + 1

    def _template(self, i: int) -> None:
        """Scan template text from `i` to its closing backtick or its next `${` (then code follows)."""
        src = self.src
        while src[i] != "`" and src[i : i + 2] != "${":
            i += 2 if src[i] == "\\" else 1
        if src[i] == "`":
            self._literal(i + 1)
        else:
            self.braces.append("${")
            self._literal(i + 2)

    def _regex_allowed(self) -> bool:
        if not self.tokens:
            return True
        last = self.tokens[-1].text
        return last in _REGEX_AFTER_PUNCTUATION or last in _REGEX_AFTER_WORDS or last == "=>"

    def _regex_end(self, start: int) -> int:
        i, in_class = start + 1, False
        while in_class or self.src[i] != "/":
            c = self.src[i]
            if c == "\\":
                i += 1
            elif c in "[]":
                in_class = c == "["
            i += 1
        flags = _WORD.match(self.src, i + 1)
        return flags.end() if flags else i + 1


def _js_function_header(tokens: list[Token], brace: int, opening_paren: dict[int, int]) -> Span | None:
    """The function whose body opens at tokens[brace] (length still unknown), or None."""
    before = tokens[brace - 1] if brace else None
    if before is None:
        return None
    if before.text == "=>":
        return Span(_arrow_name(tokens, brace - 1, opening_paren), before.line, 0)
    if before.text == ")":
        paren = opening_paren[brace - 1]
        name = tokens[paren - 1] if paren else None
        if name is not None and _WORD.fullmatch(name.text) and name.text not in _NOT_FUNCTIONS:
            return Span(name.text if name.text != "function" else "<anonymous>", name.line, 0)
    return None


def _arrow_name(tokens: list[Token], arrow: int, opening_paren: dict[int, int]) -> str:
    """`const name = (...) => {`: the name; an arrow passed as an argument is `<arrow>`."""
    params = opening_paren.get(arrow - 1, arrow - 1)  # `(a, b) =>` or `a =>`
    if params >= 3 and tokens[params - 1].text == "async":
        params -= 1
    if params >= 2 and tokens[params - 1].text in ("=", ":"):
        return tokens[params - 2].text
    return "<arrow>"


def js_functions(source: str) -> Iterator[Span]:
    tokens = _JsTokenizer(source).run()
    opening_paren: dict[int, int] = {}
    open_parens: list[int] = []
    open_braces: list[Span | None] = []
    for index, token in enumerate(tokens):
        if token.text == "(":
            open_parens.append(index)
        elif token.text == ")":
            opening_paren[index] = open_parens.pop()
        elif token.text == "{":
            open_braces.append(_js_function_header(tokens, index, opening_paren))
        elif token.text == "}":
            header = open_braces.pop()
            if header is not None:
                yield Span(header.name, header.line, token.line - header.line + 1)
    if open_braces or open_parens:  # a literal the tokenizer misread: say so rather than guess
        raise ValueError(f"unbalanced braces or parentheses ({len(open_braces)}, {len(open_parens)} open)")


# ---- the tests -----------------------------------------------------------------------------------
def _report(offenders: list[str], what: str) -> str:
    return f"{len(offenders)} {what}:\n  " + "\n  ".join(offenders)


def test_no_python_file_over_the_limit() -> None:
    offenders = []
    for path in python_files():
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES:
            offenders.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not offenders, _report(offenders, f"files over {MAX_FILE_LINES} lines")


def test_no_python_function_over_the_limit() -> None:
    offenders = []
    for path in python_files():
        for f in python_functions(path.read_text()):
            if f.lines > MAX_FUNCTION_LINES:
                offenders.append(f"{path.relative_to(ROOT)}:{f.line} {f.name}: {f.lines} lines")
    assert not offenders, _report(offenders, f"functions over {MAX_FUNCTION_LINES} lines")


def test_no_dashboard_js_function_over_the_limit() -> None:
    files = sorted(JS_FOLDER.rglob("*.js"))
    assert files, f"no JS under {JS_FOLDER}"
    offenders = []
    for path in files:
        for f in js_functions(path.read_text()):
            if f.lines > MAX_FUNCTION_LINES:
                offenders.append(f"{path.relative_to(ROOT)}:{f.line} {f.name}: {f.lines} lines")
    assert not offenders, _report(offenders, f"JS functions over {MAX_FUNCTION_LINES} lines")


JS_SAMPLE = """\
// a } in a comment, and /* { */ in a block comment
export function outer(a, b) {
  const s = "}{" + '\\'}' + `${a + `${"}"}`} }`;
  if (a) { b = /[/}]\\}/g.test(s) ? a / 2 : b; }
  const inner = async (x) => {
    return x;
  };
  return [1, 2].map((v) => v * 2);
}
class Chart {
  draw() {
    for (const k of []) {}
  }
  get size() { return 1; }
}
items.forEach((item) => {
  item();
});
"""


def test_the_js_scanner_finds_each_function_and_its_length() -> None:
    found = sorted((f.line, f.name, f.lines) for f in js_functions(JS_SAMPLE))
    assert found == [
        (2, "outer", 8),
        (5, "inner", 3),
        (11, "draw", 3),
        (14, "size", 1),
        (16, "<arrow>", 3),
    ]


def test_python_functions_count_nested_functions_in_their_span() -> None:
    source = "def outer():\n    def inner():\n        return 1\n\n    return inner\n"
    found = sorted((f.line, f.name, f.lines) for f in python_functions(source))
    assert found == [(1, "outer", 5), (2, "inner", 2)]
