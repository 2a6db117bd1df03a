"""Write the command-line reference, docs/cli/*.md, from deltastream.cli's own parser.

One page per ``deltastream COMMAND`` (its usage, arguments and options, with their help,
defaults and choices, exactly as argparse has them), and ``deltastream.md`` for the options
every command takes. Run it after changing the command line::

    python docs/gen_cli.py

tests/test_docs.py renders the pages again and fails when the committed ones differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
OUT = DOCS / "cli"
#: A page's hand-written examples, included after the generated reference when present:
#: docs/examples/cli/COMMAND.sh, and for some commands the examples of a guide.
EXAMPLES = DOCS / "examples" / "cli"
GUIDE_EXAMPLES = {
    "demo": ["getting-started/1-demo.sh"],
    "serve": ["following/deltastream.toml", "following/3-serve.sh"],
}
HEADER = (
    "<!-- Generated from deltastream.cli's parser by docs/gen_cli.py: do not edit. "
    "Run `python docs/gen_cli.py` after changing the command line. -->"
)


def _parser() -> argparse.ArgumentParser:
    sys.path.insert(0, str(ROOT))
    from deltastream.cli import _build_parser

    return _build_parser()


def _subcommands(
    parser: argparse.ArgumentParser,
) -> tuple[argparse._SubParsersAction[argparse.ArgumentParser], dict[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return action, helps
    raise SystemExit("deltastream's parser has no subcommands")


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None and not action.option_strings:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper()


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def _with_value(flag: str, action: argparse.Action) -> str:
    """``--flag VALUE`` as typed, by the action's ``nargs``."""
    if not _takes_value(action):
        return flag
    value = _metavar(action)
    if action.choices is not None:
        value = "{" + ",".join(map(str, action.choices)) + "}"
    if action.nargs == "*":
        return f"{flag} [{value} ...]"
    if action.nargs == "+":
        return f"{flag} {value} [{value} ...]"
    if action.nargs == "?":
        return f"{flag} [{value}]"
    return f"{flag} {value}"


def _help(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%(" in text:
        params = dict(vars(action), prog=prog)
        text = text % params
    return " ".join(text.split())


def _groups(parser: argparse.ArgumentParser) -> dict[int, int]:
    """Each mutually exclusive option's group number (by the action's id)."""
    out: dict[int, int] = {}
    for n, group in enumerate(parser._mutually_exclusive_groups, 1):
        for action in group._group_actions:
            out[id(action)] = n
    return out


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]


def _usage(prog: str, parser: argparse.ArgumentParser) -> str:
    """The usage line: required options and arguments as written, the rest in brackets, the
    options of one mutually exclusive group joined by ``|``; wrapped at 88 columns."""
    groups = _groups(parser)
    parts: list[str] = []
    done: set[int] = set()
    for action in _visible(parser):
        if id(action) in done:
            continue
        if not action.option_strings:
            parts.append(_metavar(action))
            continue
        group = groups.get(id(action))
        if group is not None:
            members = parser._mutually_exclusive_groups[group - 1]._group_actions
            done.update(id(a) for a in members)
            text = " | ".join(_with_value(a.option_strings[-1], a) for a in members)
            required = parser._mutually_exclusive_groups[group - 1].required
            parts.append(f"({text})" if required else f"[{text}]")
            continue
        text = _with_value(action.option_strings[-1], action)
        parts.append(text if action.required else f"[{text}]")
    if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        parts.append("COMMAND ...")
    lines: list[str] = []
    line = prog
    for part in parts:
        if len(line) + 1 + len(part) > 88 and line.strip():
            lines.append(line)
            line = " " * (len(prog) + 1) + part
        else:
            line += " " + part
    lines.append(line)
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Help text as literal Markdown in a table cell."""
    for char in "\\`*_<>[]|":
        text = text.replace(char, "\\" + char)
    return text


def _option_rows(parser: argparse.ArgumentParser, prog: str) -> tuple[list[str], list[str]]:
    groups = _groups(parser)
    positionals: list[str] = []
    options: list[str] = []
    for action in _visible(parser):
        text = _help(action, prog)
        if not action.option_strings:
            positionals.append(f"| `{_metavar(action)}` | {_cell(text)} |")
            continue
        flags = ", ".join(f"`{_with_value(f, action)}`" for f in action.option_strings)
        notes: list[str] = []
        if action.required:
            notes.append("required")
        group = groups.get(id(action))
        if group is not None:
            others = [
                a.option_strings[-1]
                for a in parser._mutually_exclusive_groups[group - 1]._group_actions
                if a is not action
            ]
            notes.append("not with " + ", ".join(f"`{o}`" for o in others))
        if isinstance(action, argparse._AppendAction) and "may repeat" not in text:
            notes.append("may repeat")
        shown_default = (
            action.default is not None
            and action.default is not False
            and action.default != []
            and action.default != ""
            and _takes_value(action)
            and "default" not in text
        )
        if shown_default:
            notes.append(f"default: `{action.default}`")
        text = _cell(text)
        if notes:
            text = f"{text} ({'; '.join(notes)})" if text else "; ".join(notes)
        options.append(f"| {flags} | {text} |")
    return positionals, options


def _page(prog: str, title_help: str, parser: argparse.ArgumentParser, examples: list[Path]) -> str:
    out = [HEADER, "", f"# {prog}", ""]
    if title_help:
        sentence = title_help[0].upper() + title_help[1:]
        out += [_cell(sentence if sentence.endswith(".") else sentence + "."), ""]
    if parser.description and parser.description != title_help:
        out += [_cell(" ".join(parser.description.split())), ""]
    out += ["## Usage", "", "```text", _usage(prog, parser), "```", ""]
    positionals, options = _option_rows(parser, prog)
    if positionals:
        out += ["## Arguments", "", "| argument | meaning |", "| --- | --- |", *positionals, ""]
    if options:
        out += ["## Options", "", "| option | meaning |", "| --- | --- |", *options, ""]
    if examples:
        out += ["## Examples", ""]
        for example in examples:
            language = "toml" if example.suffix == ".toml" else "sh"
            rel = example.relative_to(ROOT).as_posix()
            out += [f"```{language}", f'--8<-- "{rel}"', "```", ""]
    return "\n".join(out)


def _default(value: object) -> str:
    if value is None:
        return ""
    value = getattr(value, "value", value)  # an enum's member: its value
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | int):
        return f"`{value}`"
    return ""


def _config_page() -> str:
    """The keys of a ``serve`` file's ``[[tables]]`` (and ``[defaults]``): the stream options
    of deltastream.daemon.stream.config, with their ``tail`` flags and Python keywords."""
    from deltastream.daemon.stream.config import OPTIONS

    rows = ["| key | `tail` flag | `deltastream.tail` keyword | default | meaning |"]
    rows.append("| --- | --- | --- | --- | --- |")
    for option in OPTIONS.values():
        rows.append(
            f"| `{option.key}` | `{option.flag}` | `{option.name}` | {_default(option.default)} "
            f"| {_cell(' '.join(option.help.split()))} |"
        )
    return "\n".join(
        [
            HEADER,
            "",
            "# Stream options",
            "",
            "Every option of a stream, in its three spellings: a key of a `serve` file's "
            "`[[tables]]` (and `[defaults]`), a flag of `deltastream tail`, and a keyword of "
            "`deltastream.tail(...)`. They have the same defaults and are checked by the same "
            "rules: a wrong type or value is an error naming the place, the key and the value.",
            "",
            "Besides these, a `[[tables]]` entry has `name`, `uri`, `sink` (required) and "
            "`state` (default: `[defaults]`'s `state_dir`, then the stream's name under it). "
            "See [Following tables](../following.md#serve-many-tables) for the file's layout.",
            "",
            *rows,
            "",
        ]
    )


def render() -> dict[str, str]:
    """Every page of the reference: file name (under docs/cli/) to Markdown."""
    parser = _parser()
    sub, helps = _subcommands(parser)
    pages: dict[str, str] = {}
    commands = ["| command | what it does |", "| --- | --- |"]
    for name, command in sub.choices.items():
        own = EXAMPLES / f"{name}.sh"
        examples = [own] if own.is_file() else []
        examples += [DOCS / "examples" / p for p in GUIDE_EXAMPLES.get(name, [])]
        pages[f"{name}.md"] = _page(f"deltastream {name}", helps.get(name, ""), command, examples)
        commands.append(f"| [`deltastream {name}`]({name}.md) | {_cell(helps.get(name, ''))} |")
    top = _page("deltastream", parser.description or "", parser, [])
    pages["stream-options.md"] = _config_page()
    pages["deltastream.md"] = "\n".join(
        [
            top.rstrip("\n"),
            "",
            "`-v` and `--log-level` go before or after the command, with the same meaning"
            " (`deltastream -v read …`, `deltastream read … --log-level debug`; given after the"
            " command, `--log-level` wins). A misspelt option, command or choice is an error"
            " (exit status 2) under the usage of the command it belongs to, with a suggestion:"
            " `deltastream changes: error: unrecognized arguments: --form 3; --form: did you"
            " mean --from?`.",
            "",
            "## Commands",
            "",
            *commands,
            "",
        ]
    )
    return pages


def main() -> None:
    OUT.mkdir(exist_ok=True)
    pages = render()
    for stale in OUT.glob("*.md"):
        if stale.name not in pages and stale.name != "index.md":
            stale.unlink()
    for name, text in pages.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(pages)} pages to {OUT.relative_to(ROOT)}/")


if __name__ == "__main__":
    main()
