"""``rvsup completion SHELL``: the shell's completion script, generated from the command line's
own parser by shtab (so it cannot fall behind it); the job file argument completes file names."""

from __future__ import annotations

import argparse

__all__ = ["completion_script"]


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (bash, zsh or tcsh)."""
    import shtab  # generates the script from the parser itself: it cannot fall behind it

    for action in _all_actions(parser):
        if action.dest == "job":
            action.complete = shtab.FILE  # type: ignore[attr-defined]
    text: str = shtab.complete(parser, shell=shell)
    return text


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    found = list(parser._actions)  # noqa: SLF001 -- argparse offers no public walk
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in action.choices.values():
                found += _all_actions(sub)
    return found
