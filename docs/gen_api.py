"""Docs stage: the Python API reference of docs/python-api.md, rendered from the docstrings.

The page is prose written by hand with generated blocks between markers, plain Markdown that
reads the same on the repository's web page and in the mkdocs site:

    <!-- api fastload.pack = converters.packing.loop.pack -->
    ...what this script writes...
    <!-- /api -->

``NAME = PATH`` shows the object at PATH (a module, class or function of fastload/ or
converters/) under the name users call it by; a bare PATH is its own name. After ``;``,
``members: a, b`` picks a class's members (nothing after the colon: none) and ``inherited: a, b``
adds members it inherits. A class shows its ``__init__`` signature, bases and docstring, then
each public member that has a docstring, in source order; a module its docstring and each public
member's. The source is read statically with griffe (no import: neither torch nor fastload's
other dependencies need be installed).

    python docs/gen_api.py           # rewrite the page's blocks from the docstrings
    python docs/gen_api.py --check   # exit 1 if the page is not what the docstrings give
"""

from __future__ import annotations

import argparse
import functools
import logging
import re
import sys
from pathlib import Path

import griffe

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "python-api.md"
COMMAND = "python docs/gen_api.py"
WIDTH = 100  # a signature longer than this puts one parameter on each line

_BLOCK = re.compile(r"(<!-- api (?P<spec>.*?) -->\n)(?P<body>.*?)(<!-- /api -->)", re.DOTALL)
_ROLE = re.compile(r":(?:class|mod|func|meth|attr|data|exc|obj):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    """``:class:`a.b.C``` as `a.b.C`, and ``:class:`~a.b.C``` as `C` (Sphinx's short form)."""
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _markdown(text: str) -> str:
    """Docstring markup as Markdown: ``code`` and :role:`path` become `code`."""
    return _ROLE.sub(_role, text).replace("``", "`")


def _parameters(function: griffe.Function | griffe.Class) -> list[str]:
    """Each parameter as written in the source, with the ``/`` and ``*`` markers between them."""
    kind = griffe.ParameterKind
    params = [p for p in function.parameters if p.name not in ("self", "cls")]
    parts: list[str] = []
    for k, p in enumerate(params):
        if p.kind is kind.keyword_only and not any(q.kind in (kind.keyword_only, kind.var_positional)
                                                   for q in params[:k]):
            parts.append("*")
        star = {kind.var_positional: "*", kind.var_keyword: "**"}.get(p.kind, "")
        text = star + p.name + (f": {p.annotation}" if p.annotation is not None else "")
        if p.default is not None:
            text += f" = {p.default}" if p.annotation is not None else f"={p.default}"
        parts.append(text)
        if p.kind is kind.positional_only and (k + 1 == len(params) or params[k + 1].kind is not kind.positional_only):
            parts.append("/")
    return parts


def _signature(name: str, function: griffe.Function | griffe.Class, returns: bool = True) -> str:
    params = _parameters(function)
    tail = f" -> {function.returns}" if returns and function.returns is not None else ""
    line = f"{name}({', '.join(params)}){tail}"
    if len(line) <= WIDTH:
        return line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){tail}"


def _code(text: str) -> list[str]:
    return ["```text", text, "```", ""]


def _docstring(obj: griffe.Object) -> list[str]:
    """The docstring's sections: text as written, Args/Attributes/Raises as lists."""
    if obj.docstring is None:
        return []
    out: list[str] = []
    for section in obj.docstring.parse(griffe.Parser.google, warn_unknown_params=False):
        kind = section.kind.value
        if kind == "text":
            out += [_markdown(section.value), ""]
        elif kind in ("parameters", "other parameters", "attributes", "raises", "warns"):
            title = {"parameters": "Arguments", "other parameters": "Other arguments"}.get(kind, kind.capitalize())
            out += [f"**{title}:**", ""]
            for item in section.value:
                label = item.name if kind not in ("raises", "warns") else item.annotation
                body = _markdown(item.description).replace("\n", "\n  ")
                out.append(f"- `{label}`: {body}")
            out.append("")
        elif kind in ("returns", "yields", "receives"):
            for item in section.value:
                out += [f"**{kind.capitalize()}:** {_markdown(item.description)}", ""]
        elif kind == "admonition":
            title = section.title or section.value.kind.capitalize()
            out += [f"**{title}:** {_markdown(section.value.description)}", ""]
        elif kind == "examples":
            for sub_kind, text in section.value:
                out += _code(text) if sub_kind.value == "examples" else [_markdown(text), ""]
        else:
            raise ValueError(f"{obj.path}: a docstring section of kind {kind!r}, which {COMMAND} does not "
                             f"render yet; teach _docstring it")
    return out


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object:
    return obj.final_target if obj.is_alias else obj


def _members(obj: griffe.Object, pick: list[str] | None, inherited: list[str]) -> list[griffe.Object]:
    """The members shown under ``obj``: those picked, or each public one with a docstring."""
    if pick is not None:
        return [_target(obj.all_members[name]) for name in pick]
    if obj.is_module:  # what it exports, else what it defines (not what it imports)
        names = [n for n, m in obj.members.items() if (n in obj.exports if obj.exports else not m.is_alias)]
    else:
        names = list(obj.members)
    names += inherited
    shown = [_target(obj.all_members[n]) for n in names if not n.startswith("_")]
    return [m for m in shown if m.docstring is not None and (m.is_class or m.is_function or m.is_attribute)]


def _render(obj: griffe.Object, name: str, level: int, pick: list[str] | None = None,
            inherited: tuple[str, ...] = ()) -> list[str]:
    """``obj`` under a heading of ``level`` named ``name``, then its members one level down."""
    out = [f"{'#' * level} `{name}`", ""]
    if obj.is_function:
        out += _code(_signature(name, obj))
    elif obj.is_attribute:
        label = "property" if "property" in obj.labels else "attribute"
        shown = f"{obj.name}: {obj.annotation}" if obj.annotation is not None else ""
        if shown and obj.value is not None and "class-attribute" in obj.labels:
            shown += f" = {obj.value}"
        out += [f"*{label}*" + (f" `{shown}`" if shown else ""), ""]
    elif obj.is_class:
        if obj.parameters:
            out += _code(_signature(name, obj, returns=False))
        bases = [str(base) for base in obj.bases if not str(base).startswith("_")]
        if bases:
            out += ["Bases: " + ", ".join(f"`{base}`" for base in bases), ""]
    out += _docstring(obj)
    if obj.is_class and "__init__" in obj.members:
        out += _docstring(obj.members["__init__"])
    if obj.is_class or obj.is_module:
        prefix = name if obj.is_module else name.rsplit(".", 1)[-1]
        for member in _members(obj, pick, list(inherited)):
            out += _render(member, f"{prefix}.{member.name}", min(level + 1, 6))
    return out


def _spec(spec: str) -> tuple[str, str, list[str] | None, tuple[str, ...]]:
    """``NAME = PATH; members: a, b; inherited: c`` as (name, path, members, inherited)."""
    head, *options = (part.strip() for part in spec.split(";"))
    name, _, path = head.partition("=")
    given = {key.strip(): [v.strip() for v in value.split(",") if v.strip()]
             for key, _, value in (option.partition(":") for option in options)}
    unknown = set(given) - {"members", "inherited"}
    if unknown:
        raise ValueError(f"<!-- api {spec} -->: unknown options {sorted(unknown)}; use members: or inherited:")
    return name.strip(), (path or name).strip(), given.get("members"), tuple(given.get("inherited", ()))


@functools.cache
def _packages() -> dict[str, griffe.Module]:
    """fastload/ and converters/ as griffe reads them from the source (once a process)."""
    logging.getLogger("griffe").setLevel(logging.ERROR)  # names it cannot resolve (torch, typing)
    loader = griffe.GriffeLoader(search_paths=[str(REPO)], docstring_parser=griffe.Parser.google)
    packages = {name: loader.load(name) for name in ("fastload", "converters")}
    loader.resolve_aliases(implicit=False, external=False)
    return packages


def generate(page: str) -> str:
    """``page`` with every marked block rendered again from the source."""
    packages = _packages()

    def block(match: re.Match[str]) -> str:
        name, path, pick, inherited = _spec(match.group("spec"))
        top, _, rest = path.partition(".")
        obj = packages[top][rest] if rest else packages[top]
        lines = _render(_target(obj), name, 4, pick, inherited)
        body = "\n".join(lines).rstrip("\n").replace("\n\n\n", "\n\n")
        return f"{match.group(1)}\n{body}\n\n{match.group(4)}"

    return _BLOCK.sub(block, page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date; write nothing")
    args = parser.parse_args(argv)
    current = PAGE.read_text()
    fresh = generate(current)
    if args.check:
        if fresh != current:
            print(f"{PAGE.relative_to(REPO)} is not what the docstrings give: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        PAGE.write_text(fresh)
        print(f"rewrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
