"""The `advisor` command line. Each subcommand lives in ``advisor/commands/<name>.py`` and
exposes ``add_parser(subparsers)`` and ``run(args) -> int``; this module only dispatches.

Nothing heavy is imported here: `advisor estimate --help` answers without importing torch.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import re
import sys

from advisor import __version__
from advisor.core.errors import AdvisorInputError

# subcommand name -> module under advisor.commands (one line each; add yours here)
COMMANDS = {
    "estimate": "estimate",
    "probe": "probe",
    "tune": "tune",
    "worker": "worker",
    "export": "export",
    "report": "report",
    "tui": "tui",
    "preflight": "preflight",
    "doctor": "preflight",
    "models": "catalogs",
    "gpus": "catalogs",
    "calibrate": "calibrate",
}


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, exit code 2 (as for every bad input)."""

    def error(self, message: str) -> None:  # noqa: D401
        self.exit(2, f"advisor {self.prog.split(' ', 1)[-1] if ' ' in self.prog else ''}: error: {message}\n"
                  .replace("advisor : ", "advisor: "))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="advisor",
                     description="Find the best way to fine-tune (and serve) an LLM on your GPU memory.")
    parser.add_argument("--version", action="version", version=f"vram-advisor {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    seen = set()
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"advisor.commands.{module}")
        if module in seen:
            continue
        seen.add(module)
        mod.add_parser(subs)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" message, with the closest flag the command has for each misspelt one."""
    import difflib

    flags = [f for f in parser._option_string_actions if f.startswith("--")]
    hints = [close[0] for word in extras
             for close in [difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.75)] if close]
    text = f"unrecognized arguments: {' '.join(extras)}"
    return text + (f"; did you mean {', '.join(hints)}?" if hints else "")


def _join_negative_values(argv: list[str]) -> list[str]:
    """`--gpu-budget -5GB` → `--gpu-budget=-5GB`, so that the value reaches its check (argparse
    would take "-5GB" for an option and lose the value from its message)."""
    out: list[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and re.match(r"^-\.?\d", tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def _quiet_libraries() -> None:
    """Keep library chatter out of the advisor's output (--debug shows it): bitsandbytes' optional
    CPU-kernel notice, DeepSpeed's accelerator notice, torchao's notice that its CUDA-only extensions did not
    load, torch's pytree deprecation notices, deprecation warnings of transformers/peft."""
    import logging
    import warnings

    for name in ("bitsandbytes", "DeepSpeed", "deepspeed", "transformers", "peft", "accelerate", "torchao",
                 "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")


def main(argv: list[str] | None = None) -> int:
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    sub = _subparsers(parser).get(next((a for a in argv if not a.startswith("-")), ""))
    known = set(parser._option_string_actions) | set(sub._option_string_actions if sub else ())
    misspelt = [a for a in argv if a.startswith("--") and len(a) > 2  # argparse takes a prefix of a flag too
                and not any(f.startswith(a.split("=", 1)[0]) for f in known)]
    if sub is not None and misspelt:  # before argparse, which would first miss a required flag the typo meant
        sub.error(unrecognized(misspelt, sub))
    args = parser.parse_args(argv)
    debug = args.debug or "--debug" in argv
    if not debug:
        _quiet_libraries()
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except AdvisorInputError as e:
        if debug:
            raise
        print(f"advisor {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if debug or e.errno not in UNWRITABLE:
            raise
        print(f"advisor {args.command}: error: {unwritable_message(e, args.command)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"advisor {args.command}: interrupted", file=sys.stderr)
        return 130


UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}
"""Errors of a folder the command cannot write (a read-only mount, no permission, a full disk): one line naming
the path, never a traceback; the command stops before it writes anything more."""


WRITES_WITH = {"tune": "--reports-dir (the study) or --export", "export": "--out", "report": "--out",
               "calibrate": "ADVISOR_MEMORY_CALIBRATION"}
"""The flag that moves what each command writes."""


def unwritable_message(e: OSError, command: str) -> str:
    where = e.filename or "a file"
    return f"cannot write {where}: {e.strerror or e}; name a writable place with {WRITES_WITH.get(command, '--help')}"
