"""Text to syntax tree: the Lark LALR parser over grammar/linnet.lark."""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import re
import unicodedata
from importlib import resources

import lark
from lark import Token, Transformer, v_args

from linnet import user_cache
from linnet.errors import LinnetError, Loc, source_lines
from linnet.frontend import ast
from linnet.ir.specialize import INT_BITS

# Friendly names for the terminals an error message may list as expected.
_TOKEN_NAMES = {
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "LBRACE": "'{'",
    "RBRACE": "'}'", "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "DOT": "'.'", "MORETHAN": "'>'",
    "LESSTHAN": "'<'", "__ANON_0": "'->'", "ADD_OP": "'+' or '-'", "MUL_OP": "an operator",
    "CMP_OP": "a comparison", "POW_OP": "'**'", "MINUS": "'-'", "$END": "the end of the file",
}


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    """The run-time parser, its tables read back from the user cache when an earlier process left
    them there: building them is 0.3-0.5 s of every start on this CPU, reading them 0.02 s. Keyed
    by the grammar and Lark's version; anything wrong with the cache just means building."""
    key = hashlib.sha256(f"{lark.__version__}\n{_grammar()}".encode()).hexdigest()[:16]
    try:
        path = user_cache.directory("parser") / f"linnet-{key}.lark"
    except OSError:  # nowhere to keep a cache
        return build_parser()
    try:
        with open(path, "rb") as f:
            return _read_parser(f)
    except Exception:  # none yet, or one this Lark cannot read: built, and written (over it)
        pass
    parser = build_parser()
    try:
        with user_cache.replacing(path) as tmp, open(tmp, "wb") as f:
            parser.save(f)
    except OSError:  # a read-only cache: build each time
        pass
    return parser


def _read_parser(f) -> lark.Lark:
    """A saved parser with this process's lexer callbacks: `Lark.load` takes no options, its
    `_load` (what Lark's own cache calls) does. Should a Lark change that, the parser is built."""
    return lark.Lark.__new__(lark.Lark)._load(f, lexer_callbacks=_LEXER_CALLBACKS)


@functools.lru_cache(maxsize=1)
def _grammar() -> str:
    """The grammar's text, read once: the keywords, the cache key and a build all need it."""
    return resources.files("linnet").joinpath("grammar/linnet.lark").read_text()


def _keywords() -> frozenset:
    """The grammar's words (`for`, `if`, `true`, ...): its quoted literals that look like names."""
    return frozenset(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', _grammar()))


def _name_token(token: Token) -> Token:
    """Where the grammar takes a name but not a keyword, its lexer reads the keyword as a name: `if =
    x` would parse, and then fail somewhere far from it. A keyword is never a name: it goes back to
    its own terminal (Lark names a word's terminal by the word in capitals), which the parser
    refuses there; `parse` then tells a keyword used as a name from one out of place."""
    if token.value in _KEYWORDS:
        token.type = token.value.upper()
    return token


def _renamed_keyword(token: Token) -> bool:
    """Whether `token` is a keyword that `_name_token` gave back its terminal."""
    return token.value in _KEYWORDS and token.type == token.value.upper()


class _BadNumber(Exception):
    def __init__(self, token: Token, why: str):
        self.token = token
        self.why = why


_NUMBER = re.compile(r"(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


def _number_token(token: Token) -> Token:
    """The lexer reads a number with whatever letters, digits, `_` and `.` touch it (the grammar's
    NUMBER), so that a malformed one is refused at itself rather than at the token after it."""
    text = token.value
    if _NUMBER.fullmatch(text):
        return token
    if "_" in text:
        why = "digits are written without `_`"
    elif re.fullmatch(r"(\d+\.\d*|\.\d+|\d+)[eE][+-]?", text):
        why = "an exponent needs its digits, as in `1e5` or `1e-5`"
    else:
        why = "a number is digits, with at most one `.` and an exponent (`1.5`, `.5`, `1e-5`)"
    raise _BadNumber(token, why)


_KEYWORDS = _keywords()
_ITEM_KEYWORDS = frozenset({"arch", "card", "import", "config", "meta", "params", "state", "fn", "entry"})
# NAME last: Lark (1.3) chains a callback onto its own keyword check for NAME with a closure over its
# loop variable, so whichever terminal comes last in this dict is the one that chain tests for.
_LEXER_CALLBACKS = {"NUMBER": _number_token, "NAME": _name_token}


def build_parser(strict: bool = False) -> lark.Lark:
    """The LALR parser over grammar/linnet.lark. `strict` also proves that no two terminals can
    match the same text (Lark's strict mode, with `interegular`): tests/frontend/test_grammar.py
    builds it so. Every process start would pay for that proof (0.42 s against 0.14), for a
    grammar that does not change under it."""
    return lark.Lark(_grammar(), strict=strict, parser="lalr", propagate_positions=True, maybe_placeholders=True,
                     lexer_callbacks=_LEXER_CALLBACKS)


def parse(source: str, path: str = "<string>") -> ast.File:
    """Parses one file; syntax errors are raised as `LinnetError` with the offending token."""
    source = source.removeprefix("\ufeff")  # a byte-order mark (some editors write one): no character of the text
    try:
        tree = _parser().parse(source)
    except lark.exceptions.UnexpectedToken as err:
        tok = err.token
        if _names_something(err):
            raise LinnetError(Loc(path, tok.line, tok.column, tok.end_line, tok.end_column, source),
                              f"`{tok}` is a keyword: it cannot name anything") from None
        raise _syntax_error(err, source, path) from None
    except lark.exceptions.UnexpectedInput as err:
        raise _syntax_error(err, source, path) from None
    except _BadNumber as err:
        tok = err.token
        raise LinnetError(Loc(path, tok.line, tok.column, tok.end_line, tok.end_column, source),
                          f"`{tok}` is not a number: {err.why}") from None
    _check_nesting(tree, path, source)
    try:
        return _ToAst(path, source).transform(tree)
    except lark.exceptions.VisitError as err:  # a LinnetError raised while building the AST
        if isinstance(err.orig_exc, LinnetError):
            raise err.orig_exc from None
        raise


def _names_something(err: lark.exceptions.UnexpectedToken) -> bool:
    """Whether a keyword refused where a name may stand is meant as a name (`then = x`, `true: bool`):
    read as one, the next two tokens go on. A keyword out of place (`params` after a `config` block
    left open, `x + if c then ...`) stops there, and is reported as any unexpected token."""
    tok = err.token
    if not _renamed_keyword(tok) or "NAME" not in err.expected or err.interactive_parser is None:
        return False
    cursor = err.interactive_parser.copy(deepcopy_values=False)  # (the error's own stays as it was)
    try:
        cursor.feed_token(Token.new_borrow_pos("NAME", tok.value, tok))
        for i, token in enumerate(cursor.lexer_thread.lex(cursor.parser_state)):
            cursor.feed_token(token)
            if i == 1:
                return True
        cursor.feed_eof(tok)  # (the file ends within the two)
    except (lark.exceptions.UnexpectedInput, _BadNumber):
        return False
    return True


# Deeper than this, the recursive passes after the parser (building the AST, checking, lowering,
# Python compiling the generated module) would run out of stack; no model comes near it.
MAX_NESTING = 200


def _check_nesting(tree: lark.Tree, path: str, source: str) -> None:
    """A syntax tree nested past MAX_NESTING (a chain of some hundreds of `+`, say) is an error at
    the outermost expression that holds it, found without recursing."""
    stack = [(tree, 1, None)]
    while stack:
        node, depth, outer = stack.pop()
        outer = outer or (node if node.data in _EXPRESSIONS else None)
        if depth > MAX_NESTING:
            meta = (outer or node).meta
            raise LinnetError(Loc(path, meta.line, meta.column, meta.end_line, meta.end_column, source),
                              f"expression nested too deeply (over {MAX_NESTING} levels): give some of its parts names")
        stack.extend((child, depth + 1, outer) for child in node.children if isinstance(child, lark.Tree))


# The grammar's expression rules: where an error about nesting points.
_EXPRESSIONS = frozenset({"if_expr", "or_op", "and_op", "not_op", "compare", "binary", "neg", "subscript",
                          "method_call", "cast", "call", "slice", "kwarg", "number", "string", "name", "true",
                          "false", "list"})


def _syntax_error(err: lark.exceptions.UnexpectedInput, source: str, path: str) -> LinnetError:
    line, col = max(err.line, 1), max(err.column, 1)
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        char = source[err.pos_in_stream] if err.pos_in_stream < len(source) else ""
        if char == '"':  # a string is one token: one that fails to lex is a string that does not end
            return LinnetError(Loc(path, line, col, line, col + 1, source),
                               "unterminated string: a string closes with `\"` on the line it opens")
        return LinnetError(Loc(path, line, col, line, col + 1, source), f"unexpected character {char!r}",
                           _character_note(char, source[err.pos_in_stream + 1:err.pos_in_stream + 2]))
    token = getattr(err, "token", None)
    expected = err.expected or ()
    if token is not None and _renamed_keyword(token) and getattr(err, "interactive_parser", None) is not None:
        # refused before the reductions a name would have made: what the parser takes after those
        expected = err.interactive_parser.accepts()
    raw_expected = set(expected)  # the terminals' names, before they are put in words
    notes = []
    if token is not None and token.value in _ITEM_KEYWORDS and "RBRACE" in expected:
        # a word that starts a top-level block, where a block is still open: most likely its `}` is missing
        notes = [f"`{token}` begins a top-level declaration, but a block is still open before it: is a `}}` missing?"]
    expected = sorted({_TOKEN_NAMES.get(t, repr(t.lower()) if t.isupper() else t) for t in expected})
    hint = f"; expected {_join(expected)}" if expected and len(expected) <= 8 else \
        "; expected '}' or more of what comes before it" if notes else ""
    at_end = token is None or token.type == "$END"
    if not at_end:
        notes = notes or _python_habit(source, err.pos_in_stream, token) \
            or _other_language(source, err.pos_in_stream, token, raw_expected) \
            or _mistyped_keyword(source, err.pos_in_stream, token)
    opener = _open_bracket(source, len(source) if at_end else token.start_pos)
    if opener is not None:
        char, (open_line, open_col) = opener
        closer = _CLOSER_TERMINALS[char]
        mismatched = not at_end and token.type in _CLOSER_TERMINALS.values() and token.type != closer
        # its closer could have come here, and what came instead is no part of what it holds: a `(` or `[`
        # left open at the end of an earlier line, or a block before a top-level word (in a block, a
        # `}` can always come where a statement is refused: that says nothing of the block)
        forgotten = closer in raw_expected and not at_end and (
            token.value in _ITEM_KEYWORDS if char == "{" else token.line > open_line)
        if at_end or mismatched or forgotten:
            notes = notes + [f"the `{char}` at {path}:{open_line}:{open_col} is {'never' if at_end else 'not'} closed"]
    if at_end:
        lines = source_lines(source) or [""]
        last = len(lines)
        end_col = len(lines[-1]) + 1
        return LinnetError(Loc(path, last, end_col, last, end_col + 1, source), f"unexpected end of file{hint}", notes)
    attribute = _attribute_before(source, err.pos_in_stream)
    if attribute is not None and str(token) != "(" and "\n" in source[attribute.end(1):err.pos_in_stream]:
        # `x.T` ending its line: refused at the next line's first token, which says nothing; said at the name
        start = attribute.start(1)
        at_line, at_col = source.count("\n", 0, start) + 1, start - source.rfind("\n", 0, start)
        return LinnetError(Loc(path, at_line, at_col, at_line, at_col + len(attribute[1]), source),
                           f"unexpected end of line after `.{attribute[1]}`; expected '('", notes)
    width = max(1, len(str(token)))
    return LinnetError(Loc(path, line, col, line, col + width, source), f"unexpected {str(token)!r}{hint}", notes)


_CLOSER_TERMINALS = {"(": "RPAR", "[": "RSQB", "{": "RBRACE"}
_BRACKETS = re.compile(r'"(?:[^"\\\n]|\\.)*"|#[^\n]*|[()\[\]{}]')  # strings and comments hold no bracket


def _open_bracket(source: str, end: int) -> tuple[str, tuple[int, int]] | None:
    """The innermost bracket still open at offset `end` of `source`, with its line and column (in
    characters, 1-based); None when all are closed. The text before `end` parsed, so its closers match."""
    stack = []
    for m in _BRACKETS.finditer(source, 0, end):
        text = m.group()
        if text in _CLOSER_TERMINALS:
            stack.append(m.start())
        elif text in ")]}" and stack:
            stack.pop()
    if not stack:
        return None
    start = stack[-1]
    line = source.count("\n", 0, start) + 1
    return source[start], (line, start - (source.rfind("\n", 0, start) + 1) + 1)


# What another language writes with a character Linnet lacks, and Linnet's way (docs/language.md).
_CHARACTER_HABITS = {
    "'": "a string is written in double quotes: \"...\"",
    ";": "statements need no separators: end the line instead",
    "&": "logical and is the word `and`", "|": "logical or is the word `or`",
    "!": "logical not is the word `not` (and `!=` compares)", "~": "logical not is the word `not`",
}


def _character_note(char: str, after: str) -> list[str]:
    """A note on a character the lexer refuses: Linnet's spelling where another language's is the likely
    cause, and the name of a character outside ASCII (a letter in a name, a look-alike of `-` or `"`, a
    space that shows as none)."""
    if char in _CHARACTER_HABITS and not (char == "!" and after == "="):
        return [_CHARACTER_HABITS[char]]
    if char.isascii():
        return []
    named = f"U+{ord(char):04X} {unicodedata.name(char, 'is not a character of the language')}"
    if char.isalpha():
        return [f"{named}: a name is ASCII letters, digits and `_` ([A-Za-z_][A-Za-z0-9_]*)"]
    return [f"{named}: the language's characters are ASCII, outside strings and comments"]


_COMPARISONS = ("<", ">", "<=", ">=", "==", "!=")


def _attribute_before(source: str, pos: int):
    """The match of a `.name` that ends the code before offset `pos` (its group 1 the name), outside a
    comment; else None."""
    attribute = re.search(r"\.[ \t]*([A-Za-z_][A-Za-z0-9_]*)\s*$", source[:pos])
    if attribute is None or "#" in source[source.rfind("\n", 0, attribute.start()) + 1:attribute.start()]:
        return None
    return attribute


def _python_habit(source: str, pos: int, token) -> list[str]:
    """A note where Python's or NumPy's syntax, which Linnet lacks, is the likely cause: an
    attribute (`x.shape`, `x.T`: after `.name` only a call goes on), an ellipsis (`x[..., 0]`), an
    augmented assignment (`x += y`) or a walrus (`x := y`); or `without` with no base before it."""
    attribute = _attribute_before(source, pos)
    if attribute is not None and str(token) != "(":
        name = attribute[1]
        instead = {"T": "`x.transpose(1, 0)` swaps two dims", "shape": "a tensor's sizes are the dims of its type, "
                   "written by name", "dtype": "a tensor's element type is its type's: convert with `x as f32`"}
        return [f"`.{name}` is read as a method call (`x.f(...)` is `f(x, ...)`): Linnet has no attributes"
                + (f"; {instead[name]}" if name in instead else "")]
    if source.startswith("...", pos) or source[:pos].rstrip().endswith(".."):
        return ["Linnet has no `...`: index the leading dims one by one (`x[:, :, 0]`)"]
    augmented = re.match(r"(\*\*|//|[-+*/%])=", source[pos:])
    if augmented is not None:
        target = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", source[:pos])
        name = target[1] if target is not None else "x"
        return [f"Linnet has no `{augmented[0]}`: write `{name} = {name} {augmented[1]} ...`"]
    if source.startswith(":=", pos):
        return ["a local is bound with `=` (Linnet has no `:=`)"]
    line_so_far = source[source.rfind("\n", 0, pos) + 1:pos]
    sizes = _sizes_at_a_call(source, pos, token, line_so_far)
    if sizes:
        return sizes
    if str(token) in _COMPARISONS and re.search(r"(?:[<>]=?|[=!]=)[^<>=!\n]*$", line_so_far):
        return [f"comparisons do not chain as Python's do: join them with `and` (`a < b and b {token} c`)"]
    if str(token) == "without":
        return ["`without` follows the base an architecture extends: `arch NAME extends BASE without a, b`"]
    return []


def _sizes_at_a_call(source: str, pos: int, token, line_so_far: str) -> list[str]:
    """A note for sizes written at a call, as a fn's own declaration writes them: `f<n, heads>(x)` is read
    as `f < n` then a `,`, and `f<n>(x)` as `f < n > (x)`, a chained comparison."""
    # (a `>` only where written as a call is, `f<n>(`: `a < b > (c)`, spaced, is the comparison it reads as)
    called = re.search(r"(\w+)[ \t]*<[^<>()\n]*$" if str(token) == "," else r"(\w+)<\w+$", line_so_far)
    if (str(token) in (",", ">") and called and not re.search(r"(?:^|\W)fn[ \t]+\w+[ \t]*<[^<>()\n]*$", line_so_far)
            and re.match(r"[^\n]*>[ \t]*\(", source[pos:])):
        return [f"a call does not write its sizes: `{called[1]}(...)` takes them from its arguments' types"]
    return []


def _other_language(source: str, pos: int, token, expected: set) -> list[str]:
    """A note where a first card or architecture is written as another language would write it: `def`
    for `fn`, `let x = ...`, a local with a type (`x: T[n] = ...`), a card's name unquoted, a card that
    extends where it imports, a card's value set with `:` as an architecture declares one."""
    before = source[:pos]
    # `def`: refused itself at the top level; in a body it reads as a name, and the fn's name after it is refused
    if str(token) == "def" or re.search(r"(?:^|[^\w.])def[ \t]+$", before):
        return ["a function is declared with `fn` (one the engine calls, with `entry`)"]
    # a `:` that ends its line, where a `{` could come (after a fn's result type, an entry's
    # parentheses, a block's name): Python's block
    if str(token) == ":" and "LBRACE" in expected and re.match(r"[ \t]*(?:#[^\n]*)?(?:\n|$)", source[pos + 1:]):
        return ["a block is written in braces, `{ ... }`, not after a `:`"]
    line_so_far = before[before.rfind("\n") + 1:]
    if _comment_by_slashes(source, pos):
        return ["a comment starts with `#`"]
    if str(token) == "if" and line_so_far.strip():  # after a value: Python's `a if c else b`
        return ["Linnet writes a choice as `if c then a else b`"]
    if str(token) == "if" and "RBRACE" in expected:
        return ["`if` is an expression, `x = if c then a else b`, with a static condition: Linnet has no `if` "
                "statement (`where(c, a, b)` chooses element by element)"]
    if re.search(r"(?:^|\n)[ \t]*import[ \t]+\S*[ \t]*$", before):  # (on the import's own line)
        return ["`import` takes the architecture's name, as its `arch` line gives it: `import llama` looks for "
                "llama.linnet beside the card, in arch/ beside it, and among the built-in ones"]
    if str(token) == "=" and source.startswith("=>", pos):
        return ["a fn's result type follows `->`"]
    if str(token) == "[" and "LESSTHAN" in expected:
        return ["a fn's sizes are written in angle brackets: `fn f<n>(x: T[n, dim])`"]
    sizes = _sizes_at_a_call(source, pos, token, line_so_far)
    if sizes:
        return sizes
    if token.type == "NAME" and re.search(r"(?:^|[^\w.])(let|var|const|val)\s+$", before):
        return [f"a local is bound with `{token} = ...`: Linnet has no `let`"]
    name = re.search(r"(\w+)\s*:?\s*$", before)
    if str(token) == ":" and "EQUAL" in expected and "COLON" not in expected and name is not None:
        return [f"a local takes its type from its value: write `{name[1]} = ...` (`linnet ir` shows the types)"]
    if "STRING" in expected and re.search(r"(?:^|\n)\s*card\s*$", before):
        written = re.match(r"[^\s#]*", source[pos:])[0]
        return [f"a card's name is a string: `card \"{written}\"`"]
    if str(token) == "extends" and re.search(r"(?:^|\n)\s*card\s+\"[^\"\n]*\"\s*$", before):
        return ["a card imports its architecture on a line of its own: `import NAME` (an `arch` extends another)"]
    if token.type in ("NUMBER", "STRING") and "NAME" in expected and name is not None and before.rstrip()[-1:] == ":":
        return [f"a card sets a value with `=` (`{name[1]} = {token}`); `{name[1]}: int` declares one, in an "
                f"architecture"]
    return []


# `//` beginning its line, or followed by two words (no division is): a comment in C's way
_SLASH_COMMENT = re.compile(r"^[ \t]*//|//[ \t]*[A-Za-z_]\w*[ \t]+[A-Za-z_]", re.M)


def _comment_by_slashes(source: str, pos: int) -> bool:
    """Whether a syntax error at `pos` comes of a comment written `// ...`, which reads as a division
    of the line before by its first word: then its second word, or the next line's first token
    (`// the norm` read as `x // the`, then a statement `norm`), is refused."""
    def slashes(start: int) -> bool:  # on the line from `start`, outside a `#` comment
        end = source.find("\n", start)
        return _SLASH_COMMENT.search(source[start:len(source) if end < 0 else end].split("#", 1)[0]) is not None

    line_start = source.rfind("\n", 0, pos) + 1
    if slashes(line_start):
        return True
    # the line before, for the next line's first token only
    line_before = source.rfind("\n", 0, line_start - 1) + 1
    return bool(line_start) and not source[line_start:pos].strip() and slashes(line_before)


def _mistyped_keyword(source: str, pos: int, token) -> list[str]:
    """A note where the word before an unexpected token is a keyword misspelt (`retrun x` reads
    as a name, then fails at `x`), or the token itself is (`parmas {` where a block may begin):
    the keyword meant."""
    before = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*$", source[:pos])
    for word in ([before[1]] if before else []) + ([str(token)] if token.type == "NAME" else []):
        # short names are too near to tell; a keyword's plural or longer form (`states`) is a name
        if len(word) < 4 or any(word.startswith(k) for k in _KEYWORDS if len(k) >= 4):
            continue
        close = difflib.get_close_matches(word, sorted(_KEYWORDS), n=1, cutoff=0.75)
        if close:
            return [f"did you mean `{close[0]}` for `{word}`?"]
    return []


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def _number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


# Python's string escapes; Python keeps any other backslash as it is (with a warning), which would
# make a mistyped escape a silent part of a tensor's name
_ESCAPE = re.compile(r"""\\(?:[\\'"abfnrtv0-7xuUN]|(.))""")


def _unquote(text: str, loc: Loc | None = None) -> str:
    unknown = next((m for m in _ESCAPE.finditer(text[1:-1]) if m.group(1) is not None), None)
    if unknown is not None:
        raise LinnetError(loc, f"unknown escape {unknown.group(0)!s} in string {text}",
                          ["a backslash is written \\\\; the escapes are Python's (\\n, \\t, \\\", \\xNN, ...)"])
    try:  # non-ASCII characters pass through as themselves; backslash escapes are Python's
        return text[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as err:
        raise LinnetError(loc, f"bad escape in string {text}: {err.reason}") from None


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds `ast` nodes from the parse tree, each with its source span."""

    def __init__(self, path: str, source: str):
        super().__init__()
        self.path = path
        self.source = source

    def _loc(self, meta) -> Loc:
        if getattr(meta, "empty", True):
            return Loc(self.path, 0, 0, 0, 0, self.source)
        return Loc(self.path, meta.line, meta.column, meta.end_line, meta.end_column, self.source)

    def _tok(self, tok: Token) -> Loc:
        return Loc(self.path, tok.line, tok.column, tok.end_line, tok.end_column, self.source)

    # -- file
    def start(self, meta, items):
        f = ast.File(self.path, self.source)
        for item in items:
            if isinstance(item, ast.ArchDecl):
                f.arch = f.arch or item
                if f.arch is not item:
                    raise LinnetError(item.loc, "a file declares at most one `arch`")
            elif isinstance(item, ast.CardDecl):
                if f.card is not None:
                    raise LinnetError(item.loc, "a file declares at most one `card`")
                f.card = item
            elif isinstance(item, ast.ImportDecl):
                f.imports.append(item)
            elif isinstance(item, tuple) and item[0] == "config":
                f.config.extend(item[1])
            elif isinstance(item, tuple) and item[0] == "meta":
                f.meta.extend(item[1])
            elif isinstance(item, tuple) and item[0] == "params":
                f.params.extend(item[1])
            elif isinstance(item, tuple) and item[0] == "state":
                f.state.extend(item[1])
            elif isinstance(item, ast.FnDef):
                (f.entries if item.kind == "entry" else f.fns).append(item)
        return f

    def arch_decl(self, meta, c):
        name, base, without = c
        return ast.ArchDecl(self._loc(meta), str(name), None if base is None else str(base),
                            None if base is None else self._tok(base), without or [])

    def arch_without(self, meta, c):
        return [(str(t), self._tok(t)) for t in c]

    def card_decl(self, meta, c):
        return ast.CardDecl(self._loc(meta), _unquote(str(c[0]), self._tok(c[0])))

    def import_decl(self, meta, c):
        return ast.ImportDecl(self._loc(meta), str(c[0]))

    def config_block(self, meta, c):
        return ("config", c)

    def config_decl(self, meta, c):
        name, typ, default = c
        return ast.ConfigDecl(self._loc(meta), str(name), typ.dtype, typ.dtype_loc, default, typ.dims)

    def config_set(self, meta, c):
        return ast.ConfigSet(self._loc(meta), str(c[0]), c[1])

    def meta_block(self, meta, c):
        return ("meta", c)

    def meta_item(self, meta, c):
        return ast.MetaItem(self._loc(meta), str(c[0]), c[1])

    def params_block(self, meta, c):
        flat = []
        for item in c:
            flat.extend(item if isinstance(item, list) else [item])
        return ("params", flat)

    def param_loop(self, meta, c):
        var, first, stop, *items = c
        # `for l in a:b` stacks layers a .. b - 1 (say the MoE layers after a dense first one):
        # b - a of them, the pattern's `{l}` counting from a
        if stop is None:
            start, count = None, first
        elif isinstance(first, ast.Number) and first.value == 0:  # `for l in b` (counted `b` where shown, not `b - 0`)
            start, count = None, stop
        else:
            start, count = first, ast.Binary(first.loc, "-", stop, first)
        decls = [d for item in items for d in (item if isinstance(item, list) else [item])]
        for d in decls:  # an inner loop's params were declared first: this loop goes outside
            d.loops.insert(0, (str(var), count, self._tok(var)))
            if start is not None:
                d.loop_starts[str(var)] = start
        return decls

    def param_decl(self, meta, c):
        name, typ, tie, *sources = c
        return ast.ParamDecl(self._loc(meta), str(name), typ, tie, sources)

    def param_tie(self, meta, c):
        return (str(c[0]), self._tok(c[0]), c[1])

    def param_source(self, meta, c):
        fmt, pattern, *transforms = c
        return ast.Source(self._loc(meta), str(fmt), self._tok(fmt), _unquote(str(pattern), self._tok(pattern)), self._tok(pattern), transforms)

    def param_transform(self, meta, c):
        name, *args = c
        return ast.Transform(self._loc(meta), str(name), [a for a in args if a is not None])

    def state_block(self, meta, c):
        return ("state", c)

    def state_decl(self, meta, c):
        return ast.StateDecl(self._loc(meta), str(c[0]), c[1])

    def type(self, meta, c):
        dtype, *dims = c
        if len(dims) == 1 and dims[0] is None:
            dims = None  # no brackets: a scalar type
        elif dims == [None, None] or (dims and all(d is None for d in dims)):
            dims = []
        return ast.TypeExpr(self._loc(meta), str(dtype), self._tok(dtype), [d for d in dims] if dims is not None else None)

    def _fn(self, kind, meta, c):
        name, dim_params, *rest = c
        ret, body = rest[-2], rest[-1]
        args = [a for a in rest[:-2] if a is not None]
        return ast.FnDef(self._loc(meta), kind, str(name), dim_params or [], args, ret, body)

    def fn_def(self, meta, c):
        return self._fn("fn", meta, c)

    def entry_def(self, meta, c):
        return self._fn("entry", meta, c)

    def dim_params(self, meta, c):
        return [(str(t), self._tok(t)) for t in c]

    def arg(self, meta, c):
        return ast.Arg(self._loc(meta), str(c[0]), c[1])

    def block(self, meta, c):
        return list(c)

    # -- statements
    def assign(self, meta, c):
        return ast.Assign(self._loc(meta), [(str(c[0]), self._tok(c[0]))], c[1])

    def assign_multi(self, meta, c):
        *names, value = c
        return ast.Assign(self._loc(meta), [(str(n), self._tok(n)) for n in names], value)

    def store(self, meta, c):
        target, *indices, value = c
        return ast.Store(self._loc(meta), str(target), self._tok(target), indices, value)

    def for_stmt(self, meta, c):
        return ast.For(self._loc(meta), str(c[0]), self._tok(c[0]), c[1], c[2])

    def return_stmt(self, meta, c):
        return ast.Return(self._loc(meta), c[0])

    # -- expressions
    def if_expr(self, meta, c):
        return ast.IfExpr(self._loc(meta), *c)

    def or_op(self, meta, c):
        return ast.Binary(self._loc(meta), "or", c[0], c[1])

    def and_op(self, meta, c):
        return ast.Binary(self._loc(meta), "and", c[0], c[1])

    def not_op(self, meta, c):
        return ast.Unary(self._loc(meta), "not", c[0])

    def compare(self, meta, c):
        return ast.Binary(self._loc(meta), str(c[1]), c[0], c[2])

    def binary(self, meta, c):
        return ast.Binary(self._loc(meta), str(c[1]), c[0], c[2])

    def neg(self, meta, c):
        return ast.Unary(self._loc(meta), "-", c[0])

    def subscript(self, meta, c):
        return ast.Subscript(self._loc(meta), c[0], list(c[1:]))

    def slice(self, meta, c):
        return ast.Slice(self._loc(meta), c[0], c[1])

    def method_call(self, meta, c):
        receiver, name, *args = c
        pos, kw = self._split_args(args)
        return ast.Call(self._loc(meta), str(name), self._tok(name), [receiver] + pos, kw)

    def call(self, meta, c):
        name, *args = c
        pos, kw = self._split_args(args)
        return ast.Call(self._loc(meta), str(name), self._tok(name), pos, kw)

    def _split_args(self, args):
        pos, kw = [], []
        for a in args:
            if a is None:
                continue
            if isinstance(a, tuple):
                kw.append(a)
            else:
                if kw:
                    raise LinnetError(a.loc, "a positional argument cannot follow a keyword argument")
                pos.append(a)
        return pos, kw

    def kwarg(self, meta, c):
        return (str(c[0]), self._tok(c[0]), c[1])

    def cast(self, meta, c):
        return ast.Cast(self._loc(meta), c[0], str(c[1]), self._tok(c[1]))

    def number(self, meta, c):
        value = _number(str(c[0]))
        if isinstance(value, float) and not math.isfinite(value):
            raise LinnetError(self._loc(meta), f"{c[0]} is too large for a float: it would be infinite")
        if isinstance(value, int) and value >= 2 ** INT_BITS:  # as a computed one is (a card's value, a dim)
            raise LinnetError(self._loc(meta), f"{c[0]} is too large for a static int",
                              [f"static ints are less than 2 ** {INT_BITS} in size"])
        return ast.Number(self._loc(meta), value)

    def string(self, meta, c):
        return ast.String(self._loc(meta), _unquote(str(c[0]), self._tok(c[0])))

    def name(self, meta, c):
        return ast.Name(self._loc(meta), str(c[0]))

    def true(self, meta, c):
        return ast.Bool(self._loc(meta), True)

    def false(self, meta, c):
        return ast.Bool(self._loc(meta), False)

    def list(self, meta, c):
        return ast.ListExpr(self._loc(meta), [x for x in c if x is not None])

    def list_comp(self, meta, c):
        item, var, count = c
        return ast.ListComp(self._loc(meta), item, str(var), self._tok(var), count)
