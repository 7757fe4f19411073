"""``sklocus data``: where the shipped evaluation folders are."""

from __future__ import annotations

from sklocus._shipped import SHIPPED, shipped_folder
from sklocus.cli._common import UserError


def run_data(arguments):
    """Print a shipped folder's path, or list them all with what they hold."""
    if arguments.name is None:
        for name, about in SHIPPED.items():
            print(f"{name}\t{shipped_folder(name)}\n  {about}")
        return 0
    try:
        folder = shipped_folder(arguments.name)
    except ValueError as error:
        raise UserError(str(error)) from None
    print(folder)
    return 0
