"""Argument types the command line's subcommands share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


class DiarizeError(Exception):
    """One line for stderr: exit status 2 before any file is diarized; a file that
    fails later is reported so and the next one goes on (exit status 1 at the end)."""
