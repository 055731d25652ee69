"""`fromscratch`'s argument parser: argparse's, saying "did you mean --max-steps?" for an option it
does not know (and "did you mean jobs?" for a command or choice). Every subcommand's parser is one of these (argparse makes subparsers of the parent's
class), so `train`, `sample`, `export` and the client commands all get it."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence


def did_you_mean(word: str, known: Sequence[str]) -> str:
    """ " (did you mean X?)" for the closest of `known` to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class Parser(argparse.ArgumentParser):
    def _check_value(self, action: argparse.Action, value: object) -> None:
        """An invalid choice (a command, a --format...): argparse's message, and the closest choice."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            if action.choices is None or not isinstance(value, str):
                raise
            guess = did_you_mean(value, [str(c) for c in action.choices])
            raise argparse.ArgumentError(action, f"{e.message}{guess}") from None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if self._subparsers is None:  # a command itself: an option it does not know is a mistake
            unknown = [a for a in extras if a.startswith("-") and a != "-" and a != "--"]
            if unknown:
                known = [o for o in self._option_string_actions if o.startswith("--")]
                self.error(
                    "; ".join(
                        f"unrecognized option {a}{did_you_mean(a.split('=', 1)[0], known)}" for a in unknown
                    )
                )
        return parsed, extras
